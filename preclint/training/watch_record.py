"""What a monitor records on one sampled step of a live training run, per layer (module path), as counts
that add up across steps and ranks.

- **Flushed gradients.** A GEMM module (Linear, Conv) computes its input's gradient row by row
  (``grad_in[b] = grad_out[b] @ W``) and its weight's gradient column by column
  (``grad_W[o, i] = sum_b grad_out[b, o] x[b, i]``): an element of either is exactly 0 only where its row
  (or column) of ``grad_out``/``x`` is all zero, or where the dtype it is computed in stores the sum as 0.
  The zeros outside such rows and columns are the gradients the step's format flushed at its loss scale
  (counted where the module computes in float16 or bfloat16: autocast, or a model in that dtype).
- **Lost updates.** The weights the step left exactly as they were although their gradient was nonzero.
- **Non-finite values.** The first module in forward order whose output is inf/NaN, the first in backward
  order whose output's gradient is, and the weights the step made inf/NaN.
- **Block scales** (the layers that run a scaled format, or every GEMM on request): per block of 32
  elements, the amax statistics of the layer's input, weight and output gradient (``statistics.block_scales``);
  under an NVFP4 recipe its block scales, under delayed scaling its stale scale (watch_scaled.py).

Tensors of a sharded parameter (FSDP2's DTensor) are read through their local shard, so counts add up.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.training.statistics import BlockScales, LOW_DTYPES, block_scales
from preclint.training.watch_scaled import LayerRecipe, declares_recipe, finish, merge, nvfp4_figures

GEMM_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
BLOCK = 32  # elements per scale block: MXFP8's block along the reduction dimension


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2, tensor parallel), any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _floating(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _floating(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _floating(v)]
    found = getattr(value, "values", None)  # a ModelOutput, a namedtuple-like mapping
    return [t for v in found() for t in _floating(v)] if callable(found) and not isinstance(value, torch.Tensor) else []


def is_scaled(module: torch.nn.Module) -> bool:
    """A module that runs a scaled (FP8, MX) format: torchao's Float8Linear and MX linears, Transformer
    Engine's layers, or weights stored in a float8 dtype."""
    kind = type(module)
    name = f"{kind.__module__}.{kind.__name__}".lower()
    if "float8" in name or "fp8" in name or "transformer_engine" in name or ".mx" in name:
        return True
    return declares_recipe(module) or any("float8" in str(p.dtype) for p in module.parameters(recurse=False))


def scaled_paths(model: torch.nn.Module, scaled: Any = None) -> List[str]:
    """The module paths whose block scales are recorded: every GEMM (``scaled="all"``), the paths named, or
    (``None``) the modules that run a scaled format."""
    return [path for path, module in model.named_modules()
            if scaled == "all" and isinstance(module, GEMM_MODULES) or (
                isinstance(scaled, (list, tuple, set)) and path in scaled) or (scaled is None and is_scaled(module))]


@dataclass
class LayerCounts:
    """One layer's figures on the sampled steps so far (counts add across steps and ranks)."""

    grad_dtype: Optional[str] = None  # the dtype its output (and its output's gradient) is computed in
    gradient_elements: int = 0  # input- and weight-gradient elements that a nonzero row/column makes nonzero
    gradient_flushed: int = 0  # of those, stored as 0
    weights: int = 0  # weight elements with a gradient
    zero_gradients: int = 0  # of those, with a gradient of exactly 0 (flushed here, or below: no signal reached)
    weights_expected_to_move: int = 0  # weight elements with a nonzero gradient
    updates_lost: int = 0  # of those, left exactly as they were by the step
    nonfinite_updates: int = 0  # weights finite before the step and inf/NaN after it
    grad_absmax: float = 0.0  # largest |gradient| of its weights (unscaled)
    blocks: Dict[str, Dict[str, float]] = field(default_factory=dict)  # tensor -> BlockScales as a dict
    scales: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # operand -> NVFP4 block scales (watch_scaled)
    delayed: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # operand -> delayed scaling's stale scale

    def add(self, other: "LayerCounts") -> None:
        self.grad_dtype = self.grad_dtype or other.grad_dtype
        for name in ("gradient_elements", "gradient_flushed", "weights", "zero_gradients", "weights_expected_to_move",
                     "updates_lost", "nonfinite_updates"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.grad_absmax = max(self.grad_absmax, other.grad_absmax)
        for tensor, stats in other.blocks.items():
            mine = self.blocks.get(tensor)
            self.blocks[tensor] = stats if mine is None else merge_blocks(mine, stats)
        for mine, theirs in ((self.scales, other.scales), (self.delayed, other.delayed)):
            for operand, figures in theirs.items():
                mine[operand] = dict(figures) if operand not in mine else merge(mine[operand], figures)

    def as_json(self) -> Dict[str, Any]:
        record = asdict(self)
        record["underflow_fraction"] = _fraction(self.gradient_flushed, self.gradient_elements)
        record["lost_update_fraction"] = _fraction(self.updates_lost, self.weights_expected_to_move)
        record["zero_gradient_fraction"] = _fraction(self.zero_gradients, self.weights)
        for key in ("blocks", "scales", "delayed"):
            if not record[key]:
                del record[key]
        return record

    def counts_only(self) -> "LayerCounts":
        """These counts without the per-operand statistics (what a total over layers adds)."""
        return LayerCounts(**{**vars(self), "blocks": {}, "scales": {}, "delayed": {}})


def _fraction(part: int, whole: int) -> Optional[float]:
    return part / whole if whole else None


def merge_blocks(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    """Two block-scale summaries as one: blocks and zero blocks added, the smallest minimum, the larger p99,
    the median weighted by block count (an approximation: the medians of parts are not the whole's)."""
    blocks = a["blocks"] + b["blocks"]
    median = (a["amax_median"] * a["blocks"] + b["amax_median"] * b["blocks"]) / blocks if blocks else 0.0
    return dict(blocks=blocks, amax_min=min(a["amax_min"], b["amax_min"]), amax_median=median,
                amax_p99=max(a["amax_p99"], b["amax_p99"]), zero_blocks=a["zero_blocks"] + b["zero_blocks"])


def _blocks(t: torch.Tensor) -> Dict[str, float]:
    stats: BlockScales = block_scales(local(t).detach().float(), BLOCK)
    return asdict(stats)


def _rows(t: torch.Tensor, conv: bool) -> torch.Tensor:
    """``t`` as (rows, features): a Linear's leading dimensions are rows; a Conv's batch is."""
    return t.reshape(t.shape[0], -1) if conv else t.reshape(-1, t.shape[-1])


def _channel_nonzero(t: torch.Tensor) -> torch.Tensor:
    """Per channel (dimension 1 of a Conv's tensor): does any element hold a nonzero value."""
    return (t != 0).transpose(0, 1).reshape(t.shape[1], -1).any(dim=1)


def _reaches(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a != 0) @ (b != 0) > 0``: where a product of ``a`` and ``b`` has a nonzero term (exact: a count)."""
    return ((a != 0).float() @ (b != 0).float()) > 0


class _GemmCall:
    """One forward of a GEMM module on a sampled step, and what its backward needs: which gradient
    elements its nonzero operands make nonzero (rows of the input's gradient, the weight's gradient)."""

    def __init__(self, module: torch.nn.Module, x: torch.Tensor) -> None:
        self.module = module
        self.conv = not isinstance(module, torch.nn.Linear)
        self.x = x.detach() if not self.conv else None  # a Linear's input, for the weight gradient's mask
        self.input_channels = _channel_nonzero(x.detach()) if self.conv else None
        self.input_grad_expected: Optional[torch.Tensor] = None

    def saw_output_grad(self, g: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The weight gradient elements this call makes nonzero; the input gradient's, kept. (A bias's
        gradient is a plain sum over the batch, which cancels to an exact 0 where batch norm follows.)"""
        weight = getattr(self.module, "weight", None)
        if weight is None or not isinstance(weight, torch.Tensor):
            return {}
        w = local(weight).detach()
        if not self.conv:
            rows = _rows(g, False)
            if w.dim() == 2 and rows.shape[1] == w.shape[0]:
                self.input_grad_expected = _reaches(rows, w)
            expected = {}
            x = _rows(self.x, False)
            if x.shape[0] == rows.shape[0]:
                expected["weight"] = _reaches(rows.t(), x)
            self.x = None
            return expected
        # a Conv: per sample (a nonzero output gradient reaches every input element the kernel covers, where
        # the weight of its channel is not all zero), and per output/input channel pair for the weight
        rows = (_rows(g, True) != 0).any(dim=1)
        channels = (w != 0).transpose(0, 1).reshape(w.shape[1], -1).any(dim=1)
        self.input_grad_expected = (rows, channels)
        out_channels = _channel_nonzero(g)
        expected = {}
        if getattr(self.module, "groups", 1) == 1 and self.input_channels.numel() == w.shape[1]:
            pairs = out_channels[:, None] & self.input_channels[None, :]
            expected["weight"] = pairs.reshape(*pairs.shape, *([1] * (w.dim() - 2))).expand(w.shape)
        return expected

    def input_grad_flushes(self, g: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(elements of the input's gradient its nonzero operands make nonzero, those stored as 0), as
        tensors on the gradient's device (read once, when the step is settled)."""
        expected = self.input_grad_expected
        self.input_grad_expected = None
        if expected is None:
            return None
        if not self.conv:
            rows = _rows(g, False)
            if rows.shape != expected.shape:
                return None
            return expected.sum(), (expected & (rows == 0)).sum()
        sample, channels = expected
        if g.dim() < 2 or g.shape[0] != sample.shape[0] or g.shape[1] != channels.shape[0]:
            return None
        mask = (sample[:, None] & channels[None, :]).reshape(*sample.shape, -1, *([1] * (g.dim() - 2))).expand(g.shape)
        return mask.sum(), (mask & (g == 0)).sum()


class StepRecorder:
    """Hooks on every module for one sampled step (installed at its first forward, removed after the
    optimizer's step): first non-finite producers, the GEMMs' flushed gradients, block scales.

    Counts and finiteness flags stay tensors on their device until ``settle()`` reads them all at once (one
    synchronization a device, not one a tensor: on a GPU each read waits for the work queued before it)."""

    def __init__(self, model: torch.nn.Module, scaled: Any = None,
                 recipes: Optional[Dict[str, LayerRecipe]] = None) -> None:
        self.layers: Dict[str, LayerCounts] = {}
        self.first_nonfinite_forward: Optional[str] = None
        self.first_nonfinite_backward: Optional[str] = None
        self.first_nonfinite_update: Optional[str] = None
        self.nonfinite_gradients: List[str] = []
        self.autocast: Optional[str] = None
        self._expected: Dict[str, torch.Tensor] = {}  # weight name -> gradient elements expected nonzero
        self._pending: List[Tuple[str, str, torch.Tensor]] = []  # (layer, LayerCounts field, a 0-d tensor)
        self._flags: List[Tuple[str, str, torch.Tensor]] = []  # (forward/backward/gradient/update, name, flag)
        self._recipes = {path: r for path, r in (recipes or {}).items() if r.nvfp4}
        self._scaled = set(scaled_paths(model, scaled)) | set(self._recipes)
        # (layer, "scales" or "delayed", operand, recipe, figures known here, figures as tensors)
        self._stats: List[Tuple[str, str, str, LayerRecipe, Dict[str, Any], Dict[str, torch.Tensor]]] = []
        modules = list(model.named_modules())
        self._modules = modules
        self._handles = [m.register_forward_hook(self._after_forward(path)) for path, m in modules]

    def layer(self, path: str) -> LayerCounts:
        return self.layers.setdefault(path, LayerCounts())

    def _after_forward(self, path: str):
        def after_forward(module, args, output):
            if not torch.is_grad_enabled():
                return
            outputs = _floating(output)
            for t in outputs:
                self._flags.append(("forward", path, ~torch.isfinite(t).all()))
            if self.autocast is None and torch.is_autocast_enabled(outputs[0].device.type if outputs else "cpu"):
                self.autocast = str(torch.get_autocast_dtype(outputs[0].device.type)).replace("torch.", "")
            low = [t for t in outputs if t.dtype in LOW_DTYPES]
            if low:
                self.layer(path).grad_dtype = str(low[0].dtype).replace("torch.", "")
            gemm = None  # flushes are counted where a GEMM computes gradients in a low dtype (float32's are moot)
            if low and isinstance(module, GEMM_MODULES) and args and isinstance(args[0], torch.Tensor):
                gemm = _GemmCall(module, args[0])
                if args[0].requires_grad:
                    args[0].register_hook(self._on_input_grad(path, gemm))
            if path in self._scaled and args and isinstance(args[0], torch.Tensor):
                blocks = self.layer(path).blocks
                blocks["input"] = _blocks(args[0])
                weight = getattr(module, "weight", None)
                if isinstance(weight, torch.Tensor):
                    blocks["weight"] = _blocks(weight)
                recipe = self._recipes.get(path)
                if recipe is not None:
                    self._nvfp4(path, "input", args[0], recipe)
                    if isinstance(weight, torch.Tensor):
                        self._nvfp4(path, "weight", local(weight), recipe)
            for t in outputs:
                if t.requires_grad:
                    t.register_hook(self._on_output_grad(path, gemm))

        return after_forward

    def _on_output_grad(self, path: str, gemm: Optional[_GemmCall]):
        def on_output_grad(grad):
            self._flags.append(("backward", path, ~torch.isfinite(grad).all()))
            if gemm is not None:
                for leaf, expected in gemm.saw_output_grad(grad.detach()).items():
                    name = f"{path}.{leaf}" if path else leaf
                    known = self._expected.get(name)
                    self._expected[name] = expected if known is None or known.shape != expected.shape else known | expected
            if path in self._scaled:
                self.layer(path).blocks["grad"] = _blocks(grad)
                if path in self._recipes:
                    self._nvfp4(path, "grad", grad, self._recipes[path])

        return on_output_grad

    def _nvfp4(self, path: str, operand: str, t: torch.Tensor, recipe: LayerRecipe) -> None:
        tiled = operand == "weight" and t.dim() == 2 and t.shape[0] % 16 == 0 and t.shape[1] % 16 == 0
        stochastic = operand == "grad" and recipe.stochastic_gradient
        figures = nvfp4_figures(t, recipe.element(operand), stochastic, tiled)
        self._stats.append((path, "scales", operand, recipe, dict(tiled=tiled), figures))

    def delayed(self, recipes: Dict[str, LayerRecipe]):
        """A receiver of delayed scaling's figures for this step (watch_scaled.AmaxHistory's ``sampled``)."""
        def receive(path: str, operand: str, figures: Dict[str, torch.Tensor]) -> None:
            self._stats.append((path, "delayed", operand, recipes[path], {}, figures))

        return receive

    def _on_input_grad(self, path: str, gemm: _GemmCall):
        def on_input_grad(grad):
            found = gemm.input_grad_flushes(grad)
            if found is not None:
                self._pending += [(path, "gradient_elements", found[0]), (path, "gradient_flushed", found[1])]

        return on_input_grad

    def before_step(self, named: List[Tuple[str, torch.nn.Parameter]]) -> Dict[str, torch.Tensor]:
        """At the optimizer's step (gradients final, unscaled): the weight gradients' flushes and largest
        magnitudes; the weights as they are, to compare with after the step."""
        before = {}
        for name, p in named:
            if p.grad is None:
                continue
            path = name.rpartition(".")[0]
            grad = local(p.grad).detach()
            finite = torch.isfinite(grad)
            self._flags.append(("gradient", name, ~finite.all()))
            if grad.numel():
                self._pending.append((path, "grad_absmax", torch.where(finite, grad.abs(), 0).max()))
            self.layer(path).weights += grad.numel()
            zero = grad == 0
            self._pending.append((path, "zero_gradients", zero.sum()))
            expected = self._expected.get(name)
            if expected is not None and expected.shape == grad.shape:
                self._pending += [(path, "gradient_elements", expected.sum()),
                                  (path, "gradient_flushed", (expected & zero).sum())]
            before[name] = local(p).detach().clone()
        return before

    def after_step(self, named: List[Tuple[str, torch.nn.Parameter]], before: Dict[str, torch.Tensor]) -> None:
        for name, p in named:
            if name not in before or p.grad is None:
                continue
            path = name.rpartition(".")[0]
            old, new, grad = before[name], local(p).detach(), local(p.grad).detach()
            moving = grad != 0
            broke = (torch.isfinite(old) & ~torch.isfinite(new)).sum()
            self._pending += [(path, "weights_expected_to_move", moving.sum()),
                              (path, "updates_lost", (moving & (new == old)).sum()), (path, "nonfinite_updates", broke)]
            self._flags.append(("update", name, broke > 0))

    def settle(self) -> None:
        """Read the step's tensors (one transfer a device) into the layers' counts and the first producers."""
        stats = [(entry, name) for entry in self._stats for name in entry[5]]
        tensors = [t for _, _, t in self._pending] + [t for _, _, t in self._flags] + \
            [entry[5][name] for entry, name in stats]
        values: List[float] = [0.0] * len(tensors)
        by_device: Dict[torch.device, List[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        for indices in by_device.values():
            read = torch.stack([tensors[i].double() for i in indices]).tolist()
            for i, value in zip(indices, read):
                values[i] = value
        for (path, figure, _), value in zip(self._pending, values):
            counts = self.layer(path)
            if figure == "grad_absmax":
                counts.grad_absmax = max(counts.grad_absmax, value)
            else:
                setattr(counts, figure, getattr(counts, figure) + int(value))
        first: Dict[str, Optional[str]] = {"forward": None, "backward": None, "update": None}
        for (kind, name, _), value in zip(self._flags, values[len(self._pending):]):
            if not value:
                continue
            if kind == "gradient":
                self.nonfinite_gradients.append(name)
            elif first[kind] is None:
                first[kind] = name
        self.first_nonfinite_forward = first["forward"]
        self.first_nonfinite_backward = first["backward"]
        self.first_nonfinite_update = first["update"]
        raw: Dict[int, Dict[str, Any]] = {}
        for (entry, name), value in zip(stats, values[len(self._pending) + len(self._flags):]):
            raw.setdefault(id(entry), dict(entry[4]))[name] = value
        for entry in self._stats:
            path, kind, operand, recipe = entry[:4]
            figures = finish(kind, recipe, operand, raw.get(id(entry), dict(entry[4])))
            kept = getattr(self.layer(path), kind)
            kept[operand] = figures if operand not in kept else merge(kept[operand], figures)  # a layer called twice
        self._pending, self._flags, self._stats = [], [], []

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._expected.clear()
