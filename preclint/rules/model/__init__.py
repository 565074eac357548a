"""Graph rules: one module per rule, named after it, with its good and bad example models."""
