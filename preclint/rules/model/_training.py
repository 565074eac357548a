"""What the training-step rules (PCL6xx) share: the example setups their tests run, and how a finding
names the parameters a step figure is about. The examples return ``(module, inputs, training step)``."""
from __future__ import annotations

from typing import List

from preclint.core.findings import percent
from preclint.predict.ordinary import STEP_SHARE

# the modes whose linear layers train as scaled GEMMs (measure/scaled_training.py), as rule precisions
SCALED_TRAINING = ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")
STEP_PRECISIONS = ("fp16", "bf16", "fp16-full", "bf16-full") + SCALED_TRAINING
STOCHASTIC_GRADIENTS = ("nvfp4",)  # the recipes whose gradients round stochastically


def regression(*, precision_loss: float = 1e-3, optimizer: str = "sgd", lr: float = 1e-2, scaler: bool = False,
               dtype=None, eps: float = 1e-8):
    """A small MLP regression (32 -> 64 -> 1, batch 256); ``precision_loss`` scales the targets and the loss
    (small values: gradients far below float16's subnormals). ``dtype``: the model cast to it (``.half()``)."""

    def build():
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        inputs = (torch.randn(256, 32),)
        targets = torch.randn(256, 1) * precision_loss
        if dtype is not None:
            model = model.to(getattr(torch, dtype))
            inputs, targets = (inputs[0].to(getattr(torch, dtype)),), targets.to(getattr(torch, dtype))

        def loss_fn(output, target):
            return torch.nn.functional.mse_loss(output, target) * precision_loss

        def make_optimizer(params):
            if optimizer == "adam":
                return torch.optim.Adam(params, lr=lr, eps=eps)
            return torch.optim.SGD(params, lr=lr)

        from preclint.load.training import training_step_of  # lazy: torch-free path

        step = training_step_of(loss_fn=loss_fn, targets=targets, make_optimizer=make_optimizer,
                                scaler=torch.amp.GradScaler("cpu") if scaler else None)
        return model, inputs, step

    return build


def classifier(*, temperature: float = 1.0, optimizer: str = "adam", lr: float = 1e-3):
    """An MLP classifier (32 -> 64 -> 64 -> 128 classes, batch 256; every layer converts under the FP8
    recipes) whose cross-entropy reads its logits divided by ``temperature``: a small one (a large logit
    scale, as contrastive losses use) makes the softmax's gradient span more than E5M2's range."""

    def build():
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 128))
        inputs, targets = (torch.randn(256, 32),), torch.randint(0, 128, (256,))

        def loss_fn(output, target):
            return torch.nn.functional.cross_entropy(output / temperature, target)

        def make_optimizer(params):
            if optimizer == "adam":
                return torch.optim.Adam(params, lr=lr)
            return torch.optim.SGD(params, lr=lr)

        from preclint.load.training import training_step_of  # lazy: torch-free path

        return model, inputs, training_step_of(loss_fn=loss_fn, targets=targets, make_optimizer=make_optimizer)

    return build


def worst(parameters, key: str, limit: int = 3) -> List[str]:
    """The parameters with the largest ``key`` above STEP_SHARE, as ``name (12%)``, largest first."""
    rows = sorted((p for p in parameters if getattr(p, key) > STEP_SHARE), key=lambda p: (-getattr(p, key), p.parameter))
    return [f"{p.parameter} ({percent(getattr(p, key))})" for p in rows[:limit]]


def module_of_worst(parameters, key: str) -> str:
    rows = sorted(parameters, key=lambda p: (-getattr(p, key), p.parameter))
    return rows[0].module if rows else ""


def scaled_cause(figures):
    """Under a scaled mode, the converted layer whose output gradient the recipe flushes most, as
    ``(path, its flushed share, the gradient's element format, whether its scale was a delayed one)``;
    None where the recipe flushes none."""
    grads = [(path, stats["grad_output"]) for path, stats in figures.scaled.items() if "grad_output" in stats]
    if not grads:
        return None
    path, grad = max(grads, key=lambda item: (item[1]["underflow_fraction"], item[0]))
    if grad["underflow_fraction"] <= 0:
        return None
    return path, grad["underflow_fraction"], grad["element"].upper(), bool(grad.get("delayed"))


def scaled_fix(cause) -> str:
    """The fix of a training finding a scaled recipe causes: the layer whose gradient it flushes kept in bfloat16."""
    if cause is None:
        return "Keep the layers whose output gradients flush in bfloat16 (--scaling keep=PATH)."
    path = cause[0] or "the layer"
    keep = (f"Keep {path} in bfloat16 (--scaling keep={path}; torchao's module_filter_fn, or outside Transformer "
            "Engine's autocast), where its output gradient keeps bfloat16's range.")
    if cause[3]:  # a delayed-scaling recipe's first step: its scale of 1.0 is the cause
        return ("Scale from the current amax (Transformer Engine's Float8CurrentScaling, torchao's dynamic scaling), "
                "or start the amax history from a calibration run. Or: " + keep)
    return keep
