"""A model and its inputs made into one ir.Graph (an FX trace, or a recorded run), and the guard around user code."""
