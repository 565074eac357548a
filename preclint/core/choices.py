"""The command line's fixed choices that belong to parts it should not import to parse arguments:
the probe's devices and backends (a check imports no probe)."""

PROBE_DEVICE_CHOICES = ("auto", "cuda", "cpu")
PROBE_BACKEND_CHOICES = ("eager", "inductor")  # measure.compiled.BACKEND_CHOICES, without importing torch here
