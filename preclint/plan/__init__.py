"""The mixed-precision plan: what to keep in float32, its verification and its exports."""
