"""`preclint diff`: why one checkpoint (or one setting) is more fragile than another, layer by layer.

* walk.py: both sides checked by the session (preclint.engine.Session), one architecture asserted;
* ledgers.py: the two ledgers (predicted, or measured with --probe) compared per precision: each
  output error, the ratio, the layers that account for the difference (local and inherited), the
  statistics that explain it, and the answer in one sentence;
* weights.py: the fraction of a checkpoint's values each low format holds exactly, and its modules'
  weights (largest weight, folded batch-norm scales);
* parting.py: two runs followed node by node: where they part above the noise floor, what each node
  contributes and inherits, and the decisions replayed;
* render.py, command.py: the outputs (console, json, sarif, html) and the command line.
"""
