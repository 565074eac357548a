"""The run-to-run noise floor: whether the model gives the same output twice.

Every mode is measured against one float64 run. A forward that draws numbers nobody controls
(``F.dropout(x, training=True)``, ``x + torch.randn_like(x)``, a ``torch.Generator`` of its own, the
time, a counter it keeps) gives another output on every run, and the probe would measure that
difference as precision error. So the reference is run a second time (its output only), and the
relative RMS of the difference of the two outputs is the floor below which a measured error cannot
be told from noise.

The second run is work done twice where the answer is known without it (``replays_alike``): a traced
graph (no Python of the model's between its ops, which could read the time or a counter) whose ops
draw nothing (no random op, no generator among their operands, torch's generators untouched by the
reference run) gives the same float64 output on a device whose kernels for its ops are deterministic:
the CPU's, and a GPU's but for the ops that accumulate with atomics (scatter_add, index_add,
index_put ...) or a cuDNN that benchmarks its algorithms per run. There the rerun is skipped.

torch's generators are not reseeded between the probe's runs: a reseed would make the two float64
runs draw alike while the float32, float16 and bfloat16 runs still draw other numbers (torch draws
``randn`` and ``rand`` differently per dtype), hiding the noise from this check but not from the
measurements. A model that seeds itself in its forward draws alike in every float64 run and counts
as deterministic here (where it draws floats, its float32 runs may still draw other ones than its
float64 runs do: this check does not see that).
"""
from __future__ import annotations

import math
from typing import Any, List, Optional

import torch

from preclint.core.errors import one_line
from preclint.core.findings import sci
from preclint.core.notes import Note
from preclint.measure.program import Program
from preclint.measure.execute import tensors
from preclint.probe.reference_pass import WideningObserver

# Two float64 runs closer than float32's rounding differ by the float64 kernels' own wobble (a GPU's
# atomic adds): no mode's error comes near it, so the model counts as deterministic.
DETERMINISTIC_BELOW = 2.0 ** -24
# A measured error counts as precision error only at this many times the floor or more: the noise
# of the reference and that of a mode's run add to about the floor, so 3x leaves a margin the size
# of the one between prediction and confirmation (verdict.CONFIRM_FRACTION).
NOISE_MARGIN = 3.0


# ops that draw random numbers (by the name FX gives a call: a function's, a method's)
RANDOM_OPS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "normal_",
    "bernoulli", "bernoulli_", "multinomial", "poisson", "uniform_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "random_", "dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_", "feature_dropout", "native_dropout",
    "rrelu", "rrelu_", "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d",
})
# modules that draw in training mode
_RANDOM_MODULES = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
                             "RReLU", "FractionalMaxPool2d", "FractionalMaxPool3d"})
# ops whose CUDA forward kernels may sum in another order on every run (torch's list for
# torch.use_deterministic_algorithms, the forward ones); ``setitem`` is an index_put_
_NONDETERMINISTIC_ON_CUDA = frozenset({
    "index_add", "index_add_", "index_copy", "index_copy_", "index_put", "index_put_", "put", "put_", "setitem",
    "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "bincount", "histc",
    "embedding_bag", "kthvalue", "median", "nanmedian", "ctc_loss", "nll_loss", "cumsum", "cumprod", "unique",
    "interpolate", "grid_sample", "roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool", "deform_conv2d",
})
# where the function of a traced call may come from and still run nothing but tensor ops
_TENSOR_OP_MODULES = ("torch", "_operator", "operator", "builtins", "math", "torchvision.ops")


def generator_states(device) -> tuple:
    """The states of torch's default generators that a run on ``device`` could draw from."""
    states = [torch.get_rng_state()]
    if device.type == "cuda" and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return tuple(states)


def replays_alike(program: Program, model, device, before: tuple) -> bool:
    """Whether a second run of ``program`` on ``model`` would give the reference's output again, known
    without running it: a traced graph of tensor ops, none of which draws (``before``: the
    generator_states ahead of the reference run), on deterministic kernels (module docstring)."""
    if not program.is_fx or len(before) != len(generator_states(device)) or any(
            not torch.equal(a, b) for a, b in zip(before, generator_states(device))):
        return False
    if device.type == "cuda" and torch.backends.cudnn.benchmark:
        return False
    for node in program.fx_graph.nodes:
        if node.op == "call_module":
            try:
                module = model.get_submodule(node.target)
            except AttributeError:
                return False
            kind = type(module)
            if kind.__name__ in _RANDOM_MODULES and module.training:
                return False
            if not kind.__module__.startswith("torch.") and kind.__name__ != "FrozenBatchNorm2d":
                return False  # a leaf of the model's own: its Python runs again
            name = kind.__name__.lower()
        elif node.op == "call_function":
            origin = getattr(node.target, "__module__", None) or "builtins"
            if not origin.startswith(_TENSOR_OP_MODULES):
                return False  # a function FX was told to keep whole (torch.fx.wrap): any Python
            name = getattr(node.target, "__name__", str(node.target))
        elif node.op == "call_method":
            name = str(node.target)
        else:
            continue
        if name in RANDOM_OPS or any(isinstance(v, torch.Generator) for v in _operands(node)):
            return False
        if device.type == "cuda" and (name in _NONDETERMINISTIC_ON_CUDA or name.replace("_", "") in _CUDA_MODULES):
            return False
    return True


# the module forms of the ops above (class names, lowered, without underscores)
_CUDA_MODULES = frozenset({"embeddingbag", "upsample", "upsamplingbilinear2d", "upsamplingnearest2d", "ctcloss",
                           "nllloss", "roialign", "roipool", "psroialign", "psroipool", "deformconv2d"})


def _operands(node) -> list:
    import torch.fx

    found: list = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), found.append)
    return found


def rerun(program: Program, model, inputs, known: Optional[tuple] = None) -> Any:
    """The model's output on ``inputs`` once more, run as the reference ran (the eager recording of
    the first run is kept: it names the reference's nodes); the exception where it fails.
    ``known``: (device, generator_states before the first run, its output), which is returned,
    not run again, where ``replays_alike`` says a second run would give it."""
    if known is not None and replays_alike(program, model, known[0], known[1]):
        return known[2]
    recorded = program.recorded
    try:
        with torch.no_grad():
            return program.run(model, inputs, WideningObserver())
    except Exception as exc:  # noqa: BLE001 - the floor is unknown, the probe goes on
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return exc
    finally:
        program.recorded = recorded


def settle_floor(first: Any, again: Any, name: str, env: dict, notes: List[Note]) -> Optional[float]:
    """The noise floor of the reference output ``first`` and its rerun ``again`` (an exception where
    the rerun failed): None for a deterministic model; otherwise the floor, put in the reference's
    environment and said in one of ``notes``."""
    reference = env["reference"].get("dtype", "float64")
    if again is first:  # not run again: the same by construction (replays_alike)
        return None
    if isinstance(again, BaseException):
        notes.append(Note("noise", f"whether {name} is deterministic is not known: its second {reference} run failed "
                                   f"({one_line(again)})"))
        return None
    floor = floor_of(run_to_run(first, again))
    if floor is not None:
        env["reference"]["deterministic"] = False
        env["reference"]["run_to_run_rel_rms"] = floor if math.isfinite(floor) else None
        notes.append(Note("noise", describe(name, floor, reference)))
    return floor


def run_to_run(first: Any, second: Any) -> float:
    """Relative RMS of ``second - first`` over the float outputs (as the modes' output error is
    taken); inf where the two differ in shape or in an integer output (indices, labels)."""
    a, b = tensors(first), tensors(second)
    if len(a) != len(b):
        return math.inf
    sq_diff = sq_ref = 0.0
    for x, y in zip(a, b):
        if x.is_complex() and y.is_complex():
            x, y = torch.view_as_real(x), torch.view_as_real(y)
        if x.shape != y.shape or x.is_floating_point() != y.is_floating_point():
            return math.inf
        if not x.is_floating_point():
            if bool((x != y).any()):
                return math.inf
            continue
        d = y.double() - x.double()
        d = d.masked_fill(x == y, 0.0)  # the same inf in both runs is no difference
        sq_diff += float(torch.sum(d * d))
        sq_ref += float(torch.sum(torch.where(torch.isfinite(x), x.double(), 0.0) ** 2))
    if sq_diff == 0.0:
        return 0.0
    if not math.isfinite(sq_diff) or sq_ref == 0.0:
        return math.inf
    return math.sqrt(sq_diff / sq_ref)


def floor_of(difference: float) -> Optional[float]:
    """The noise floor a run-to-run ``difference`` sets: None for a deterministic model."""
    return None if difference <= DETERMINISTIC_BELOW else difference


def within_noise(floor: Optional[float], measured: Optional[float]) -> bool:
    """Whether a measured relative error cannot be told from the run-to-run noise ``floor``: one
    within NOISE_MARGIN of it, or no figure to tell it by (None); inf/NaN is no noise."""
    if floor is None:
        return False
    return measured is None or (math.isfinite(measured) and measured < NOISE_MARGIN * floor)


def describe(name: str, floor: float, reference: str = "float64") -> str:
    """The note that says the model is not deterministic, with the figure."""
    if math.isfinite(floor):
        difference = f"differs from the first by relative RMS {sci(floor)} at the output"
    else:
        difference = "gives outputs of other shapes or other integer values"
    return (f"{name} is not deterministic: a second {reference} run on the same inputs {difference} (random draws "
            f"or state the probe does not control: dropout left on, noise added in forward, a generator of its "
            f"own); measured errors below {NOISE_MARGIN:g}x that are noise, not precision error, and confirm no finding")
