"""PCL102 unrepresentable-constant."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, sci
from preclint.core.ir import Kind
from preclint.reference.analyses.reach import Reach
from preclint.core.numerics import FORMATS, dtype_name, representable, round_to
from preclint.predict.range import CHECKED_CONVERSION, dtype_derived, reaching_absmax
from preclint.rules.base import Example, Rule
from preclint.rules.model._dataflow import downstream, users_by_input

# Which scalar arguments of an op are constants that meet the op's values (not dims or exponents).
CONSTANT_ARGS = {
    "add": ("arg1", "other"), "sub": ("arg1", "other"), "rsub": ("arg1", "other"),
    "div": ("arg1", "other"), "true_divide": ("arg1", "other"),
    "clamp": ("arg1", "arg2", "min", "max"), "clip": ("arg1", "arg2", "min", "max"),
    "clamp_min": ("arg1", "min"), "clamp_max": ("arg1", "max"),
    "masked_fill": ("arg2", "value"), "where": ("arg1", "arg2", "other"),
    "full": ("arg1", "fill_value"), "full_like": ("arg1", "fill_value"), "new_full": ("arg2", "fill_value"),
    "normalize": ("eps",), "cosine_similarity": ("eps",), "pairwise_distance": ("eps",),
}
# ops whose eps guards a division inside them
GUARDING_OPS = frozenset({"normalize", "cosine_similarity", "pairwise_distance"})
# ops that a guard protects: a zero (or subnormal) argument gives inf, NaN or a huge value
GUARDED = {"div": 1, "true_divide": 1, "rsqrt": 0, "sqrt": 0, "log": 0, "log2": 0, "log10": 0, "log1p": 0,
           "reciprocal": 0}
# ops through which a guard keeps guarding: var + eps -> sqrt -> div
GUARD_CHAIN = frozenset({"sqrt", "pow", "clamp", "clamp_min", "abs"})


def _is_guarded_operand(user, position: int) -> bool:
    """Whether the input at ``position`` of ``user`` is what its division, root or log must keep from 0."""
    guarded_position = GUARDED.get(user.fn)
    if guarded_position is None:
        return False
    if user.fn in ("div", "true_divide") and len(user.inputs) == 1:
        # one tensor operand: it is the divisor when the numerator is the scalar (`1 / t`), whose
        # value capture does not keep, and the dividend when the divisor is (`t / 2`)
        return "arg1" not in user.scalars and "other" not in user.scalars
    return guarded_position == position


def _eps_rms_norm():
    import torch

    class HandRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            h = self.proj(x)
            ms = (h * h).mean(dim=-1, keepdim=True)  # stays float16 under autocast
            return h / torch.sqrt(ms + 1e-8)  # 1e-8 is 0 in float16

    torch.manual_seed(0)
    return HandRMSNorm(), (torch.randn(4, 64),)


def _mask_fill():
    import torch

    class MaskedScores(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(32, 32)
            self.k = torch.nn.Linear(32, 32)

        def forward(self, x, mask):
            scores = self.q(x) @ self.k(x).transpose(-2, -1)  # float16 under autocast
            return torch.softmax(scores.masked_fill(mask, -1e9), dim=-1)

    torch.manual_seed(0)
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
    return MaskedScores(), (torch.randn(2, 8, 32), mask)


def _dtype_aware_constants():
    import torch

    class Safe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            h = self.proj(x)
            ms = h.pow(2).mean(dim=-1, keepdim=True)  # pow runs in float32 under autocast
            scores = h @ h.transpose(-2, -1)
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), torch.finfo(scores.dtype).min)
            return torch.softmax(scores, dim=-1) @ (h / torch.sqrt(ms + 1e-5))

    torch.manual_seed(0)
    return Safe(), (torch.randn(4, 64),)


def _where_fill(whole_row_masked: bool):
    def build():
        import torch

        class MaskedScores(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q = torch.nn.Linear(32, 32)
                self.k = torch.nn.Linear(32, 32)

            def forward(self, x, keep):
                scores = self.q(x) @ self.k(x).transpose(-2, -1)  # float16 under autocast
                return torch.softmax(torch.where(keep, scores, -1e9), dim=-1)  # -1e9 is -inf in float16

        torch.manual_seed(0)
        keep = torch.ones(8, 8, dtype=torch.bool).tril()
        if whole_row_masked:
            keep[0] = False
        return MaskedScores(), (torch.randn(2, 8, 32), keep)

    return build


class UnrepresentableConstant(Rule):
    code = "PCL102"
    needs = (Reach,)
    name = "unrepresentable-constant"
    summary = "An eps, mask-fill or clamp constant becomes 0, subnormal or inf in the dtype its op computes in."
    severity = "warning"
    # every mode: what decides is the format a value is computed in, and a model that sets autocast
    # itself computes in float16 or bfloat16 under tf32 too
    precisions = ()
    why = """
A constant meets the tensor in the tensor's dtype. In float16, 1e-8 and 1e-12 are 0, anything below
6.1e-5 is subnormal (a few bits, flushed to zero by some kernels and engines), and -1e9 is beyond
65504. An eps that guards a division, sqrt, rsqrt or log stops guarding: `x / sqrt(v + 1e-8)` is
inf or NaN as soon as v is 0. A mask value of -1e9 makes `masked_fill` raise ("value cannot be
converted to type c10::Half without overflow") and `where` store -inf, which turns into NaN when
a whole row is masked. Under autocast, elementwise ops run in the dtype of their inputs, which is
float16 after a conv or matmul; preclint follows the dtype each op computes in under each precision.
"""
    example = """
ms = (h * h).mean(-1, keepdim=True)        # float16 under autocast
y = h / torch.sqrt(ms + 1e-8)              # 1e-8 is 0 in float16
scores = scores.masked_fill(mask, -1e9)    # raises for float16 scores
"""
    fix = """
Use constants the dtype holds: `torch.finfo(x.dtype).min` (or a boolean mask / SDPA's attn_mask) for
masks, an eps of at least 6.1e-5 for float16 (or `torch.finfo(x.dtype).tiny`), or compute the guarded
statistic in float32 (`h.float()`, `pow` instead of `h * h` under autocast).
"""
    bad = (Example(_eps_rms_norm, "hand-written RMS norm whose eps of 1e-8 is 0 in float16"),
           Example(_mask_fill, "attention scores masked with -1e9 in float16"),
           Example(_where_fill(True), "where(keep, scores, -1e9) with a row masked whole: -inf everywhere, NaN"))
    good = (Example(_dtype_aware_constants, "the same ops with finfo(dtype).min, pow and eps=1e-5 in float32"),
            Example(_where_fill(False), "where(keep, scores, -1e9) under a causal mask: the -inf become softmax's zeros"))

    def check_graph(self, ctx):
        graph = ctx.graph
        users = users_by_input(graph)
        for node in graph.nodes:
            keys = CONSTANT_ARGS.get(node.fn)
            if not keys:
                continue
            for key in keys:
                value = node.scalars.get(key)
                if value is None or value == 0 or value != value or abs(value) == float("inf") or dtype_derived(value):
                    continue  # no constant, an intended infinity, or torch.finfo(x.dtype) that follows the dtype
                finding = self._check_constant(ctx, users, node, key, value)
                if finding is not None:
                    yield finding

    def _check_constant(self, ctx, users, node, key, value):
        fates = {}
        for mode in ctx.modes:
            fmt = ctx.predictions[mode].nodes[node.name].fmt
            if fmt not in FORMATS or fmt == "fp32":
                continue
            fate = representable(value, FORMATS[fmt])
            if fate != "exact-range":
                fates[mode] = (fmt, fate)
        if not fates:
            return None
        guarded = self._guarded_op(node, users)
        worst = "overflow" if any(f == "overflow" for _, f in fates.values()) else (
            "zero" if any(f == "zero" for _, f in fates.values()) else "subnormal")
        modes = tuple(m for m, (_, f) in fates.items() if f == worst)
        fmt = fates[modes[0]][0]
        stored = round_to(value, FORMATS[fmt])
        what = {"zero": "0", "overflow": "-inf" if value < 0 else "inf",
                "subnormal": f"the subnormal {sci(stored)}"}[worst]
        dtype = dtype_name(fmt)
        where = f"{ctx.display(node.name)}"
        message = f"The constant {sci(value)} of {where} is {what} in {dtype}, the dtype it computes in under {', '.join(modes)}"
        raises = worst == "overflow" and node.fn in CHECKED_CONVERSION
        if worst == "overflow" and not raises and not guarded and reaching_absmax(node) < abs(value) / 2:
            return None  # the elements it fills become inf, and the model discards them (softmax, where)
        if raises:
            message += f": {node.fn} raises 'value cannot be converted ... without overflow'."
            severity = "error"
        elif guarded and worst in ("zero", "overflow"):
            message += f", so it no longer guards the {guarded} it feeds: a zero there gives inf or NaN."
            severity = "error"
        elif guarded:
            message += (f"; as the guard of the {guarded} it feeds it keeps only a few bits, and kernels or engines "
                        "that flush subnormals make it 0.")
            severity = "warning"
        elif worst == "overflow":
            message += "; values it fills or clamps become infinite, and a row that is all -inf turns into NaN in softmax."
            severity = "warning"
        else:
            message += "."
            severity = "warning"
        if worst == "overflow":
            fix = f"Use torch.finfo(x.dtype).min / .max (or a boolean mask, SDPA's attn_mask) instead of {sci(value)}."
        else:
            fix = (f"Use an eps {dtype} holds (>= {sci(FORMATS[fmt].min_normal)}, e.g. torch.finfo(x.dtype).tiny), "
                   "or compute the guarded value in float32.")
        return self.finding(node, message, fix=fix, predicted={m: ErrorFigure(None, None) for m in modes},
                            severity=severity, precisions=modes)

    @staticmethod
    def _guarded_op(node, users):
        """The division, sqrt, rsqrt or log the constant keeps away from zero, if any."""
        if node.fn in GUARDING_OPS:
            return f"division inside {node.fn}"
        if node.fn not in ("add", "sub", "rsub", "clamp", "clamp_min", "clip", "where", "full", "full_like", "new_full"):
            return None
        in_chain = lambda user: user.fn in GUARD_CHAIN and user.kind != Kind.DECISION  # noqa: E731
        for user, position in downstream(users, node.name, in_chain):
            if _is_guarded_operand(user, position):
                return user.fn
        return None
