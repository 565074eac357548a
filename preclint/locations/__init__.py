"""Where a finding points: the user's line that makes an op or builds a module, and paths as printed."""
