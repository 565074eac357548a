"""What the user named (a model file, a factory, weights, input specs) made into a model and its inputs."""
