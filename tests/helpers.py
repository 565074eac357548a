"""Running the engine on a model built in a test, as `preclint check` would."""
from typing import Any, Dict, Optional, Sequence

from preclint.config import Config
from preclint.engine import CheckOptions, check_model
from preclint.load.loader import LoadedModel
from preclint.core.findings import Finding, Location
from preclint.core.numerics import DEFAULT_MODES


def check(module, inputs, precisions: Sequence[str] = DEFAULT_MODES, rtol: Optional[float] = None,
          atol: Optional[float] = None, run: bool = True, select: Optional[Sequence[str]] = None, name: str = "model",
          predict_errors: bool = True, scaling: Optional[Dict[str, Any]] = None, train=None):
    """(report, graph, ctx) for ``module`` on ``inputs`` with the default configuration; ``predict_errors``
    False computes only the analyses the selected rules read, as `preclint check --select` does;
    ``scaling``: the scaled formats' recipe options ([tool.preclint.scaling]); ``train``: a training step
    (load/training.py) to check too, as --train does."""
    from preclint.core.numerics import scaled_recipes

    config = Config(select=list(select) if select else None, precisions=tuple(precisions), scaling=dict(scaling or {}))
    loaded = LoadedModel(module.eval(), tuple(inputs), name, None, training=train)
    with scaled_recipes(config.scaling):
        return check_model(loaded, config, CheckOptions(modes=tuple(precisions), run=run, rtol=rtol, atol=atol,
                                                        predict_errors=predict_errors, train=train is not None))


def check_example(example) -> Any:
    built = example.build()
    module, inputs = built[:2]
    options: Dict[str, Any] = dict(example.options)
    if len(built) == 3:  # a training-step rule's example: (module, inputs, its training step)
        options["train"] = built[2]
    options.pop("backend", None)  # the probe's, not the check's (ProbeOptions.backend)
    return check(module, inputs, **options)


def codes(report):
    return {f.code for f in report.findings}


def finding(code="PCL502", line=2, column=6, path="pkg/m.py", severity="warning", **kw):
    """A finding as the source side makes one (a deprecated AMP call by default), for the output formats' tests."""
    loc = Location(path, line, column) if path else None
    return Finding(code, kw.pop("name", "deprecated-amp-api"), severity, kw.pop("message", "It is deprecated."),
                   kw.pop("fix", "Use the new one."), location=loc, **kw)
