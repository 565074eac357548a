"""`preclint plan`'s arguments, apart from the plan itself (plan/command.py): every command's parser
has them, and a check imports nothing of the plan."""
from __future__ import annotations
from preclint.core.choices import PROBE_BACKEND_CHOICES as BACKEND_CHOICES


def _fraction(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, not {text!r}")
    return value


def add_parser(sub, add_model_arguments, add_output_arguments) -> None:
    plan = sub.add_parser("plan", help="the fewest layers to keep in float32 that meet a tolerance, verified")
    plan.add_argument("paths", nargs=1, metavar="PATH", help="a model file or package.module:attr")
    add_model_arguments(plan)
    plan.add_argument("--max-flip", type=_fraction, metavar="FRACTION",
                      help="decision budget: the fraction of decisions (top-1 classes, thresholds, top-k) allowed to change")
    plan.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                      help="where the verification runs: cuda, cpu (the CPU's float16/bfloat16 kernels) or auto")
    plan.add_argument("--formats", metavar="FORMATS",
                      help="a format per nn.Linear layer from this list (e.g. nvfp4,mxfp8,fp8,bf16), the cheapest "
                           "that meets --rtol; instead of --precision")
    plan.add_argument("--no-verify", action="store_true", help="only predict: do not run the model with the plan")
    plan.add_argument("--policy", metavar="FILE", help="verify this plan (a JSON plan) instead of choosing one")

    plan.add_argument("--backend", choices=BACKEND_CHOICES, default="eager",
                      help="also run the verified plan compiled (inductor: torch.compile) and check that its kept "
                           "layers stay float32 in the compiled graph")
    plan.add_argument("--config", metavar="FILE", dest="config_file", help="a pyproject.toml to read [tool.preclint] from")
    plan.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    add_output_arguments(plan)
