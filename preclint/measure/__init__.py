"""Running a model under a precision and comparing it: what the probe, the plan's verifier, the
accuracy benchmark and the tests' oracle share.

* runners.py: a Runner per way of running a mode (native, emulated; an FP8 format or a compiled
  backend is one more class), each with its name and a line saying how it ran;
* modes.py: the copy of the model one mode runs, and the mode's arithmetic, op by op;
* compare.py: one record of a run's outputs against the reference's (relative RMS, largest
  difference, elements outside a tolerance, changed decisions, the first inf/NaN);
* detections.py: a detector's outputs, matched box by box;
* copies.py: ``copy_to``, the copy of a model made where and as a run needs it (deepcopy refuses
  tensors with autograd history); program.py: a copy run op by op through the capture path;
* sweep.py: one run followed node by node beside another (the probe's mode beside float64, diff's
  setting B beside A): each node's value against the first run's, and the node replayed on the
  first run's operands; execute.py: a node's call made again, and which node made a tensor;
* rounding.py, backends.py: rounding to the reduced formats, and the TF32 switch.
* compiled.py: a mode's copy run through a compiler; compilers/: the compilers, one module each
  (Inductor), found by name.

It needs no rules and no predictions: core <- load <- capture <- measure.
"""
