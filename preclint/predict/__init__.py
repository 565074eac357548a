"""The error model: per node and precision, the local rounding error and the error that reaches the output."""
