"""The measuring passes: the float64 reference, the sensitivity pass, and one sweep per mode.

* Reference: the model in float64 on the probe's device; every node's value is kept (rounded to
  float32 unless the ablation needs the float64 values: ReferenceStore).
* Sensitivity: the model with autograd; after each mode's sweep, one backward pass with the mode's
  measured output error as the cotangent gives J_i^T E at every node i at once, and so each node's
  contribution <J_i e_i, E> (ledger.py). Gradients only weight errors, a few digits are plenty, so
  on a GPU this pass runs under bfloat16 autocast.
* Sweep: the full run of the mode, observed and never altered (on a GPU the observed run is checked
  against the plain model afterwards). At each node the observer compares the value with the
  reference (received) and replays the node on reference inputs (local), keeping the local error
  vector for the contribution.

Figures are computed on the device and read back once per pass, after every mode has been issued
(``Scalars``, ``queue_figures``, ``finish``): a read per node would stall the GPU at every node, and
a read per mode would leave it idle while Python issues the next one.

Each concern has its module (reference_pass.py, sensitivity.py, sweep.py, readback.py, scalars.py);
this one names the passes the probe runs, in one place.
"""
from __future__ import annotations

from preclint.probe.readback import Pending, finish, observer_delta, queue_figures
from preclint.probe.reference_pass import ReferenceStore, reference_pass, resolve_reference
from preclint.probe.scalars import Scalars, difference, error_dtype, grouped_norms
from preclint.probe.sensitivity import Sensitivity, sensitivity_pass
from preclint.probe.sweep import OutputError, Sweep, decision_changes, integer_outputs, output_error, plain_run, sweep

__all__ = ["OutputError", "Pending", "ReferenceStore", "Scalars", "Sensitivity", "Sweep", "decision_changes", "difference",
           "error_dtype", "finish", "grouped_norms", "integer_outputs", "observer_delta", "output_error",
           "plain_run", "queue_figures", "reference_pass", "resolve_reference", "sensitivity_pass", "sweep"]
