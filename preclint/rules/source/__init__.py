"""Source rules: one module per rule, named after it, with its valid and invalid examples. No torch."""
