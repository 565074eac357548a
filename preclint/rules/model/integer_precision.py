"""PCL104 integer-precision."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.reference.analyses.margins import RoundingMargins
from preclint.core.numerics import FORMATS, FP32, MODES, dtype_name, gaussian_max_factor
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.rules.base import Example, Rule
from preclint.rules.model._dataflow import users_by_input
from preclint.rules.model._norun import undecided
from preclint.rules.model.decision_flip import MIN_EXPECTED_FLIPS, MIN_FLIP_FRACTION

ROUNDING_FNS = frozenset({"round", "floor", "ceil", "trunc"})
# ops that turn positions into an angle table on the way to its sin and cos: t * inv_freq, an einsum or
# matmul of positions and frequencies, a concatenation of the two halves
ANGLE_STEPS = frozenset({Kind.ELEMENTWISE, Kind.MATMUL, Kind.LINEAR, Kind.CAST, Kind.SHAPE})
ANGLE_HOPS = 4
ANGLE_FIX = ("Build position and angle tables in float32 with autocast disabled "
             "(`with torch.autocast(device_type, enabled=False):`) and elementwise (`t[:, None] * inv_freq`).")
VALUES_FIX = ("Keep these whole numbers in float32 (or int64 for indices and counts): cast with `.float()` and "
              "compute them where autocast is off (`with torch.autocast(device_type, enabled=False):`).")


def whole_numbers(stats) -> bool:
    """Whether a value holds whole numbers that mean something: positions, coordinates, counts.
    Beyond float32's own exact-integer range (2^24) values are whole because float32 keeps no
    fractions there, and so are the sums that cancel between them (activations of 1e11 in a deep
    random-init network): whole, but not numbers whose every unit counts."""
    return (stats is not None and stats.is_float and stats.integer_valued
            and stats.absmax <= FP32.exact_integers_to)


def feeds_angles(users, name: str) -> bool:
    """Whether the value reaches a sin or cos within a few steps of arithmetic: a rotary or
    sinusoidal position table (a position rounded there becomes a wrong angle)."""
    frontier, seen = [(name, 0)], {name}
    while frontier:
        current, hops = frontier.pop()
        for user, _ in users.get(current, []):
            if user.fn in ("sin", "cos"):
                return True
            if user.name not in seen and user.kind in ANGLE_STEPS and hops < ANGLE_HOPS:
                seen.add(user.name)
                frontier.append((user.name, hops + (user.kind != Kind.SHAPE)))
    return False


def _casts_to_integer(node) -> bool:
    dtype = node.attrs.get("dtype", "")
    return node.fn in ("long", "int", "short") or (node.kind == Kind.CAST and dtype.startswith(("int", "uint")))


def spacing(value: float, fmt) -> float:
    """Distance between neighbouring values of ``fmt`` at ``value``."""
    mantissa_bits = round(-math.log2(fmt.unit_roundoff)) - 1
    return 2.0 ** (math.floor(math.log2(max(abs(value), fmt.min_normal))) - mantissa_bits)


def _rotary(angle_table, length: int = 4096):
    """A rotary position embedding: pairs of a projection rotated by the angles of each position,
    whose cos and sin ``angle_table(x, inv_freq)`` computes."""

    def build():
        import torch

        class Rotary(torch.nn.Module):
            def __init__(self, dim: int = 32):
                super().__init__()
                self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))
                self.proj = torch.nn.Linear(dim, dim)

            def forward(self, x):
                cos, sin = angle_table(x, self.inv_freq)
                h = self.proj(x)
                h1, h2 = h[..., 0::2], h[..., 1::2]
                return torch.cat([h1 * cos - h2 * sin, h1 * sin + h2 * cos], dim=-1)

        torch.manual_seed(0)
        return Rotary(), (torch.randn(1, length, 32),)

    return build


def _einsum_angles(x, inv_freq):
    import torch

    t = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)
    angles = torch.einsum("i,j->ij", t, inv_freq)  # autocast runs einsum in bf16/fp16
    return angles.cos(), angles.sin()


def _elementwise_angles(x, inv_freq):
    import torch

    t = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)
    angles = t[:, None] * inv_freq[None, :]  # elementwise: float32 under autocast, no TF32
    return angles.cos(), angles.sin()


def _angles_autocast_off(x, inv_freq):
    """As Llama's rotary embedding built them (transformers 4.4x): a matmul of frequencies and
    positions, in float32, with autocast switched off around it."""
    import torch

    positions = torch.arange(x.shape[1], device=x.device)[None, None, :].float()
    device_type = x.device.type if isinstance(x.device.type, str) else "cpu"
    with torch.autocast(device_type=device_type, enabled=False):
        angles = (inv_freq[None, :, None].float() @ positions).transpose(1, 2)
        return angles.cos(), angles.sin()


def _huge_activations():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    with torch.no_grad():
        model[1].bias.fill_(3e10)  # outputs near 3e10: whole numbers only because float32 holds no fractions there
    return model, (torch.randn(1, 3, 16, 16),)


def _quantizer():
    import torch

    class Quantize(torch.nn.Module):
        """Integer codes of a conv's output: round(y / scale)."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)

        def forward(self, x):
            return torch.round(self.conv(x) / 0.002).to(torch.int32)

    torch.manual_seed(0)
    return Quantize(), (torch.randn(1, 8, 32, 32),)


def _coarse_quantizer():
    import torch

    class Quantize(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)

        def forward(self, x):
            return (self.conv(x) > 0).to(torch.int32) + 2 * torch.arange(4).sum().to(torch.int32)

    torch.manual_seed(0)
    return Quantize(), (torch.randn(1, 8, 32, 32),)


def _clamped_widths():
    import torch

    class BoxSizes(torch.nn.Module):
        """Integer box sizes as torchvision's keypoint head computes them: widths clamped to at least
        1 pixel, then ceil. Most boxes of this head are narrower than a pixel: they sit at the bound."""

        def __init__(self):
            super().__init__()
            self.boxes = torch.nn.Linear(32, 4)

        def forward(self, x):
            boxes = self.boxes(x)
            widths = (boxes[:, 2] - boxes[:, 0]).clamp(min=1).ceil()
            return boxes * widths[:, None]

    torch.manual_seed(0)
    model = BoxSizes().eval()
    with torch.no_grad():
        model.boxes.weight.mul_(0.5)
    return model, (torch.randn(64, 32),)


class IntegerPrecision(Rule):
    code = "PCL104"
    needs = PREDICTED_ERRORS_NEED
    name = "integer-precision"
    summary = ("Whole numbers (positions, coordinates, counts) beyond the precision's exact-integer range, "
               "or rounded to integers after reduced-precision arithmetic.")
    severity = "warning"
    precisions = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")
    why = """
float16 and TF32 hold every integer only up to 2048, bfloat16 only up to 256. Beyond that, positions,
pixel coordinates, counts and `arange` values are rounded to multiples of 2, 4, 8...: neighbouring
positions collapse into one, and a rotary or sinusoidal embedding that multiplies them by a frequency
turns the error into a wrong angle (a position of 4000 in bfloat16 is off by up to 8). Autocast
runs `einsum`/`matmul`/`linear` in the reduced dtype, so a positions-times-frequencies product is
affected even when the positions were made in float32; TF32 rounds the operands of fp32 matmuls too.
Rounding (`round`, `floor`, `.long()`) after reduced-precision arithmetic changes the integer of
every value whose distance to the next boundary is within the error: quantization codes, box
coordinates and bucket indices change.
"""
    example = """
t = torch.arange(seq_len, dtype=torch.float32)          # 0 ... 4095
angles = torch.einsum("i,j->ij", t, inv_freq)           # bf16 under autocast: t rounded to 8 bits
codes = torch.round(self.conv(x) / scale).int()         # codes flip where y/scale is near k + 0.5
"""
    fix = """
Build position and angle tables in float32 with autocast disabled
(`with torch.autocast(device_type, enabled=False):`) and elementwise (`t[:, None] * inv_freq`), keep
coordinates and indices in float32 or int64, and compute values that are rounded to integers in
float32.
"""
    bad = (Example(_rotary(_einsum_angles), "rotary angles from an einsum of positions up to 4095"),
           Example(_quantizer, "integer codes round(conv(x) / 0.002) computed in reduced precision"))
    good = (Example(_rotary(_elementwise_angles), "the angles as an elementwise product in float32"),
            Example(_rotary(_angles_autocast_off, length=1024),
                    "the angles as a matmul where the model switches autocast off", {"precisions": ("fp16", "bf16")}),
            Example(_huge_activations, "activations near 3e10, not whole numbers that mean anything",
                    {"precisions": ("bf16",)}),
            Example(_coarse_quantizer, "integers from a sign test and exact integer arithmetic"),
            Example(_clamped_widths, "ceil of box widths, most of them at the clamp's bound of 1 pixel"))

    def check_graph(self, ctx):
        if not ctx.graph.ran_reference:
            candidates = [n for n in ctx.graph.nodes
                          if n.fn in ("arange", "linspace") or n.fn in ROUNDING_FNS or _casts_to_integer(n)]
            yield from undecided(self, ctx, candidates, "positions and roundings to integers",
                                 "whether values are whole numbers, how large, and how close to a boundary")
            return
        yield from self._beyond_exact_range(ctx)
        yield from self._roundings(ctx)

    # ---------------------------------------------------------------- whole numbers out of range

    def _beyond_exact_range(self, ctx):
        graph = ctx.graph
        users = users_by_input(graph)
        reported = set()  # a value reported once is not reported again at each op that carries it on
        for node in graph.nodes:
            per_mode = {}
            for mode in ctx.modes:
                p = ctx.predictions[mode].nodes[node.name]
                for fmt, value, role in self._rounded_integers(node, MODES[mode], p.fmt):
                    per_mode[mode] = (fmt, value, role)
                    break
            if not per_mode:
                continue
            if any(i in reported for i in node.inputs):
                reported.add(node.name)
                continue
            reported.add(node.name)
            yield self._range_finding(ctx, node, per_mode, ANGLE_FIX if feeds_angles(users, node.name) else VALUES_FIX)

    @staticmethod
    def _rounded_integers(node, mode, fmt):
        """(format, largest value, 'result' | 'operand') where whole numbers beyond the format's exact
        range are rounded: a stored result, or the operands a dot product rounds."""
        if node.kind in DOT_PRODUCT_KINDS:
            dot = mode.dot_format
            if mode.rounds_products_only or fmt in ("fp16", "bf16"):
                for s in node.input_stats:
                    if whole_numbers(s) and s.absmax > dot.exact_integers_to:
                        yield dot.name, s.absmax, "operand"
            return
        out = node.out
        if fmt not in ("fp16", "bf16") or not whole_numbers(out):
            return
        if node.kind in (Kind.SHAPE, Kind.OUTPUT) or out.absmax <= FORMATS[fmt].exact_integers_to:
            return
        yield fmt, out.absmax, "result"

    def _range_finding(self, ctx, node, per_mode, fix):
        predicted = {}
        worst = None
        for mode, (fmt, value, role) in per_mode.items():
            f = FORMATS[fmt]
            step = spacing(value, f)
            # rounding a whole number is uniform over a step: RMS u/sqrt(3) relative, at most half a step
            predicted[mode] = ErrorFigure(f.unit_roundoff / math.sqrt(3.0), step / 2)
            if worst is None or step > worst[2]:
                worst = (mode, fmt, step, value, role)
        mode, fmt, step, value, role = worst
        formats = ", ".join(f"{dtype_name(per_mode[m][0])} under {m}" for m in per_mode)
        what = "reads whole numbers" if role == "operand" else "holds whole numbers"
        how = "rounds them to" if role == "operand" else "stores them in"
        message = (f"{ctx.display(node.name)} {what} up to {sci(value)} and {how} {formats}; "
                   f"{dtype_name(fmt)} is exact only to {FORMATS[fmt].exact_integers_to}, so values near "
                   f"{sci(value)} round to multiples of {sci(step)} (off by up to {sci(step / 2)}) and neighbouring "
                   "values collapse.")
        return self.finding(node, message, fix=fix, predicted=predicted, precisions=tuple(per_mode))

    # ----------------------------------------------------------------- rounding to integers

    def _roundings(self, ctx):
        sites = {}
        for node in ctx.graph.nodes:
            if node.record(RoundingMargins) is not None:
                sites.setdefault((node.module_path, node.fn, node.location), []).append(node)
        for nodes in sites.values():
            finding = self._rounding_finding(ctx, nodes)
            if finding is not None:
                yield finding

    def _rounding_finding(self, ctx, nodes):
        units = sum(n.record(RoundingMargins).units for n in nodes)
        per_mode = {}
        for mode in ctx.modes:
            preds = [(n, ctx.predictions[mode].nodes[n.name]) for n in nodes]
            preds = [(n, p) for n, p in preds if p.flip_fraction is not None and p.received]
            if not preds:
                continue
            expected = sum(p.flip_fraction * n.record(RoundingMargins).units for n, p in preds)
            per_mode[mode] = (expected, max(p.received for _, p in preds))
        flagged = [m for m, (expected, _) in per_mode.items()
                   if expected / units >= MIN_FLIP_FRACTION or expected >= MIN_EXPECTED_FLIPS]
        if not flagged:
            return None
        first = nodes[0]
        what = first.fn if first.fn in ROUNDING_FNS else "cast to an integer type"
        flips = ", ".join(f"{percent(per_mode[m][0] / units)} under {m}" for m in flagged)
        mode = max(flagged, key=lambda m: per_mode[m][0])
        message = (f"{ctx.display(first.name)} ({what}) turns values into integers after reduced-precision arithmetic: "
                   f"their predicted error ({sci(per_mode[mode][1])} under {mode}) moves about {flips} of its {units} "
                   "values across an integer boundary.")
        rms = first.input_stats[0].rms if first.input_stats and first.input_stats[0] is not None else 0.0
        predicted = {m: ErrorFigure(per_mode[m][1] / rms if rms else None,
                                    per_mode[m][1] * gaussian_max_factor(units), per_mode[m][0] / units)
                     for m in per_mode}
        return self.finding(first, message, predicted=predicted, precisions=tuple(flagged))
