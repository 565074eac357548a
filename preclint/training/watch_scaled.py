"""What a watched run's scaled layers do under their recipe (docs/training.md, "Watching a training run"):

- **NVFP4 block scales** (``scales``): per block of 16 values along the GEMM's reduction (the weight in
  16 x 16 tiles), the encoding scale the recipe computes (an E4M3 block scale times the fp32 tensor scale
  amax / (448 x 6), inverted): its min, median and p99 over the blocks that hold a nonzero value, and the
  share of the nonzero values that the E2M1 elements flush to 0 (half the smallest subnormal or below after
  scaling; the gradients round stochastically, so their share is the expected one) or saturate (beyond 6).
- **Delayed scaling** (``delayed``, Transformer Engine's DelayedScaling, ``fp8 amax-history=N``): the monitor
  keeps each operand's amax history itself, on every step (one amax a tensor, left on its device); the scale
  the recipe uses is the element's largest value over the history's largest amax (1.0 for a fresh history),
  this step's amax joining the history after it is used. A sampled step records that stale scale against
  this step's amax and the share of values it saturates or flushes; every step whose amax times the stale
  scale exceeds the element's largest value by more than rounding to it would move it (the amax jumped beyond
  the history: the values above the old amax are clipped) is listed in the next record's ``amax_jumps``.
  (``saturated`` counts every value beyond the largest, as --train's statistics do; an amax that grows by
  less than half the top spacing, 3.6% in E4M3, saturates its largest values no more than rounding would.)

A layer learns its recipe as the monitor learns which layers are scaled (``scaled=``, or their class): a
layer that carries its own recipe (preclint's emulated training layers, ``forward_recipe``) is read with
it, every other scaled layer with the ``recipe=`` given to ``preclint.watch`` ("nvfp4", "fp8 amax-history=1024").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.core.numerics import E2M1, E4M3, E5M2, MODES, SCALING_OPTIONS, Format, Recipe, scaled_mode

NVFP4_BLOCK = 16
# the gradient's element format per recipe (measure/scaled_training.py GRADIENT_ELEMENTS, the same table)
GRADIENT_ELEMENTS = {"fp8": E5M2, "fp8-rowwise": E4M3, "mxfp8": E4M3, "nvfp4": E2M1}
SATURATES = 1 + 2.0**-20  # beyond the largest value by more than float32 arithmetic's slack
FOLD = 1024  # queued amaxes of one operand read at the latest after this many (a long interval's memory)


def clip_limit(element: Format) -> float:
    """The magnitude beyond which saturating at ``element``'s largest value moves a value further than
    rounding to nearest would: the largest value plus half the spacing below it (E4M3 464, E5M2 61440)."""
    return element.max_finite + 2.0 ** math.floor(math.log2(element.max_finite)) * element.unit_roundoff


@dataclass(frozen=True)
class LayerRecipe:
    """The recipe a scaled layer runs: its forward recipe, the gradient's element format and rounding."""

    mode: str
    forward: Recipe
    gradient: Format
    stochastic_gradient: bool = False

    @property
    def delayed(self) -> bool:
        return self.forward.amax_history > 0

    @property
    def nvfp4(self) -> bool:
        return self.forward.scale == "e4m3" and not self.delayed

    def element(self, operand: str) -> Format:
        return self.gradient if operand == "grad" else self.forward.element


def parse_recipe(spec: Any) -> Optional[LayerRecipe]:
    """``recipe=`` of preclint.watch: None, or "MODE [KEY=VALUE ...]" with the --scaling options of ``MODE``
    (one of the scaled training modes); ValueError where it is not one."""
    if spec is None:
        return None
    words = spec.replace(",", " ").split() if isinstance(spec, str) else []
    if not words or words[0] not in GRADIENT_ELEMENTS:
        raise ValueError(f"preclint.watch: recipe={spec!r}; give one of {', '.join(GRADIENT_ELEMENTS)}, "
                         "optionally with scaling options (\"fp8 amax-history=1024\")")
    mode, options = words[0], {}
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in SCALING_OPTIONS or mode not in SCALING_OPTIONS[key][1] or not value:
            raise ValueError(f"preclint.watch: recipe={spec!r}: {word!r} is not a scaling option of {mode}")
        options[key] = value
    try:
        forward = scaled_mode(mode, options).recipe
    except ValueError as error:
        raise ValueError(f"preclint.watch: recipe={spec!r}: {error}") from None
    return LayerRecipe(mode, forward, GRADIENT_ELEMENTS[mode], stochastic_gradient=mode == "nvfp4")


def layer_recipe(module: torch.nn.Module, default: Optional[LayerRecipe]) -> Optional[LayerRecipe]:
    """The recipe ``module`` names itself (preclint's emulated training layers), else ``default``."""
    forward = getattr(module, "forward_recipe", None)
    if not isinstance(forward, Recipe):
        return default
    gradient = getattr(module, "gradient_recipe", None)
    mode = getattr(module, "mode", None)
    mode = mode if isinstance(mode, str) else next((m for m, v in MODES.items() if v.recipe == forward), "scaled")
    if isinstance(gradient, Recipe):
        return LayerRecipe(mode, forward, gradient.element, gradient.stochastic)
    return LayerRecipe(mode, forward, GRADIENT_ELEMENTS.get(mode, forward.element))


def declares_recipe(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "forward_recipe", None), Recipe)


# -- NVFP4 block scales ---------------------------------------------------------------------------------
def _blocks(v: torch.Tensor, tiled: bool) -> torch.Tensor:
    """``v`` as its NVFP4 blocks, one a row: 16 along the last dimension (padded with zeros), or a 2-D
    weight's 16 x 16 tiles where both its sizes are multiples of 16."""
    if tiled and v.dim() == 2 and v.shape[0] % NVFP4_BLOCK == 0 and v.shape[1] % NVFP4_BLOCK == 0:
        n, k = v.shape
        return v.reshape(n // NVFP4_BLOCK, NVFP4_BLOCK, k // NVFP4_BLOCK, NVFP4_BLOCK).permute(0, 2, 1, 3) \
            .reshape(-1, NVFP4_BLOCK * NVFP4_BLOCK)
    rows = v.reshape(-1, v.shape[-1]) if v.dim() else v.reshape(1, 1)
    pad = (-rows.shape[1]) % NVFP4_BLOCK
    return torch.nn.functional.pad(rows, (0, pad)).reshape(-1, NVFP4_BLOCK)


def _spread(values: torch.Tensor, live: torch.Tensor) -> List[torch.Tensor]:
    """[min, median, p99] of ``values`` where ``live`` (NaN where none is), without reading them to the host."""
    if values.numel() == 0:
        nan = values.new_tensor(math.nan, dtype=torch.float64)
        return [nan, nan, nan]
    kept = torch.where(live, values.double(), torch.full_like(values, math.nan, dtype=torch.float64))
    low = torch.where(live.any(), torch.where(live, kept, math.inf).min(), math.nan)
    top = torch.nanquantile(kept, 0.99) if kept.numel() < 2**24 else torch.where(live, kept, -math.inf).max()
    return [low, torch.nanmedian(kept), top]


def nvfp4_figures(t: torch.Tensor, element: Format, stochastic: bool, tiled: bool) -> Dict[str, torch.Tensor]:
    """The NVFP4 figures of ``t`` (module docstring) as tensors on its device: read when the step settles."""
    blocks = _blocks(t.detach().float(), tiled)
    amax = blocks.abs().amax(dim=1)
    tensor_scale = amax.max().clamp_min(2.0**-126) / (E4M3.max_finite * element.max_finite) if amax.numel() \
        else amax.new_tensor(1.0)
    # the E4M3 block scale (rounded to nearest even, subnormals kept: float8_e4m3fn's cast), floored at its
    # smallest normal as the recipe's amax floor does (measure/scaled.py encoding_scale)
    block_scale = (amax / element.max_finite / tensor_scale).clamp(max=E4M3.max_finite)
    block_scale = block_scale.to(torch.float8_e4m3fn).float().clamp_min(E4M3.min_normal)
    encode = 1.0 / (block_scale * tensor_scale)
    scaled = (blocks * encode[:, None]).abs()
    nonzero = blocks != 0
    if stochastic:  # a value below the smallest subnormal s survives as s with probability |v| / s
        flushed = (1 - scaled.double() / element.min_subnormal).clamp_min(0) * nonzero
    else:
        flushed = (nonzero & (scaled <= element.min_subnormal / 2)).double()
    live = amax > 0
    low, median, p99 = _spread(encode, live)
    return dict(blocks=amax.new_tensor(amax.numel()), zero_blocks=(~live).sum(), scale_min=low, scale_median=median,
                scale_p99=p99, nonzero=nonzero.sum(), underflow=flushed.sum(),
                saturated=(nonzero & (scaled > element.max_finite * SATURATES)).sum())


# -- delayed scaling ------------------------------------------------------------------------------------
def delayed_figures(t: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, history_amax: torch.Tensor,
                    element: Format) -> Dict[str, torch.Tensor]:
    """``t`` quantised at the stale per-tensor ``scale``: the shares it saturates and flushes (as tensors)."""
    scaled = t.detach().float().abs() * scale
    nonzero = t.detach() != 0
    return dict(scale=scale, current_scale=element.max_finite / amax.clamp_min(2.0**-126), amax=amax,
                history_amax=history_amax, nonzero=nonzero.sum(),
                saturated=(nonzero & (scaled > element.max_finite * SATURATES)).sum(),
                underflow=(nonzero & (scaled <= element.min_subnormal / 2)).sum())


class AmaxHistory:
    """Every step's amax of each operand of the layers under delayed scaling (hooks on those layers only,
    installed for the whole run), the scale the recipe draws from it, and the steps whose amax jumped beyond
    the history's scale. A step only queues its amaxes (one reduction a tensor, left on its device); the
    scales and jumps of the steps between records are worked out when a record is written, and a sampled
    step's scale when it runs. ``sampled`` (a callable taking an operand's figures for this step's record,
    or None) is how a sampled step's recorder receives them."""

    def __init__(self, model: torch.nn.Module, recipes: Dict[str, LayerRecipe], step) -> None:
        self.recipes = {path: r for path, r in recipes.items() if r.delayed}
        self._step = step  # a callable: the optimizer step now running
        self.sampled = None
        self._past: Dict[Tuple[str, str], List[float]] = {}  # the last N amaxes read, oldest first
        self._queued: Dict[Tuple[str, str], List[Tuple[int, torch.Tensor]]] = {}  # (step, amax) not read yet
        self._found: List[Dict[str, Any]] = []  # jumps read before the record that will list them
        modules = dict(model.named_modules())
        self._handles = [modules[path].register_forward_hook(self._after_forward(path)) for path in self.recipes
                         if path in modules]

    def _observe(self, path: str, operand: str, t: torch.Tensor) -> None:
        values = t.detach()
        # two reductions: on the CPU several times faster than abs().amax() or an inf-norm
        amax = torch.maximum(values.amax(), -values.amin()) if values.numel() else values.new_zeros(())
        queued = self._queued.setdefault((path, operand), [])
        if self.sampled is not None:
            recipe = self.recipes[path]
            element = recipe.element(operand)
            length = recipe.forward.amax_history
            recent = [a.float() for _, a in queued[-length:]]
            older = self._past.get((path, operand), [])[-(length - len(recent)):] if len(recent) < length else []
            history_amax = torch.stack(recent + [amax.new_tensor(max(older, default=0.0), dtype=torch.float32)]).max()
            scale = torch.where(history_amax > 0, element.max_finite / history_amax.clamp_min(2.0**-126),
                                torch.ones_like(history_amax))
            self.sampled(path, operand, delayed_figures(values, scale, amax.float(), history_amax, element))
        queued.append((self._step(), amax))
        if len(queued) >= FOLD:
            self._read()

    def _after_forward(self, path: str):
        def after_forward(module, args, output):
            if not torch.is_grad_enabled():
                return
            if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                self._observe(path, "input", args[0])
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor):
                self._observe(path, "weight", weight.to_local() if hasattr(weight, "to_local") else weight)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._observe(path, "grad", grad))

        return after_forward

    def jumps(self) -> List[Dict[str, Any]]:
        """The steps since the last call whose amax, at the scale of the history before it, lay beyond the
        element's largest value by more than rounding (``clip_limit``), in step order."""
        self._read()
        found, self._found = self._found, []
        return sorted(found, key=lambda jump: jump["step"])

    def _read(self) -> None:
        """Read the queued amaxes (one transfer a device), find their jumps, bring the history up to date."""
        queued, self._queued = self._queued, {}
        entries = [(key, step, amax) for key, items in queued.items() for step, amax in items]
        if not entries:
            return
        by_device: Dict[torch.device, List[int]] = {}
        for i, (_, _, amax) in enumerate(entries):
            by_device.setdefault(amax.device, []).append(i)
        read = [0.0] * len(entries)
        for indices in by_device.values():
            for i, value in zip(indices, torch.stack([entries[i][2].double() for i in indices]).tolist()):
                read[i] = value
        found, at = self._found, 0
        for (path, operand), items in queued.items():
            recipe = self.recipes[path]
            element, length = recipe.element(operand), recipe.forward.amax_history
            new = read[at:at + len(items)]
            at += len(items)
            past = self._past.get((path, operand), [])
            sequence = torch.tensor([0.0] * length + past + new, dtype=torch.float64)
            # each new amax's history: the `length` amaxes before it (zeros: none yet)
            start = length + len(past)
            history = sequence[start - length:].unfold(0, length, 1)[:len(new)].amax(dim=1).tolist()
            for (step, _), amax, before in zip(items, new, history):
                scale = element.max_finite / before if before > 0 else 1.0
                if amax * scale > clip_limit(element):
                    found.append(dict(step=step, layer=path, operand=operand, amax=amax, history_amax=before))
            self._past[(path, operand)] = (past + new)[-length:]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# -- figures as JSON, and merged across steps and ranks ---------------------------------------------------
def finish(kind: str, recipe: LayerRecipe, operand: str, raw: Dict[str, float]) -> Dict[str, Any]:
    """Figures read from the device as a record's dict: counts as integers, the shares computed."""
    nonzero = int(raw["nonzero"])
    out: Dict[str, Any] = dict(recipe=recipe.mode, element=recipe.element(operand).name, nonzero=nonzero,
                               underflow=raw["underflow"], saturated=int(raw["saturated"]))
    if kind == "scales":
        out.update(block="16x16" if operand == "weight" and raw.get("tiled") else NVFP4_BLOCK,
                   blocks=int(raw["blocks"]), zero_blocks=int(raw["zero_blocks"]),
                   scale=[raw["scale_min"], raw["scale_median"], raw["scale_p99"]])
    else:
        out.update(amax_history=recipe.forward.amax_history, scale=raw["scale"], current_scale=raw["current_scale"],
                   amax=raw["amax"], history_amax=raw["history_amax"])
    return with_shares(out)


def with_shares(figures: Dict[str, Any]) -> Dict[str, Any]:
    nonzero = figures["nonzero"]
    figures["underflow_fraction"] = figures["underflow"] / nonzero if nonzero else None
    figures["saturated_fraction"] = figures["saturated"] / nonzero if nonzero else None
    return figures


def merge(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Two records' figures of one operand as one (steps or ranks): counts added, the largest amax and the
    smallest stale scale kept, block scales' extremes kept and their medians weighted by blocks."""
    out = dict(a)
    for key in ("nonzero", "underflow", "saturated", "blocks", "zero_blocks"):
        if key in a:
            out[key] = a[key] + b.get(key, 0)
    if "blocks" in a:
        live_a, live_b = a["blocks"] - a["zero_blocks"], b["blocks"] - b["zero_blocks"]
        (low_a, med_a, top_a), (low_b, med_b, top_b) = a["scale"], b["scale"]
        medians = [(m, n) for m, n in ((med_a, live_a), (med_b, live_b)) if m is not None and n]
        out["scale"] = [_pick(min, low_a, low_b),
                        sum(m * n for m, n in medians) / sum(n for _, n in medians) if medians else None,
                        _pick(max, top_a, top_b)]
    else:
        for key in ("amax", "history_amax"):
            out[key] = _pick(max, a[key], b[key])
        out["scale"] = _pick(min, a["scale"], b["scale"])
        out["current_scale"] = _pick(min, a["current_scale"], b["current_scale"])
    return with_shares(out)


def _pick(choose, x, y):
    kept = [v for v in (x, y) if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return choose(kept) if kept else None
