"""PCL901 compiled-precision-change: the compiled graph computes a value in another precision than
the model's code (or its plan) asks for. It fires only after a probe with a compiled backend
(``preclint check --probe --backend inductor``, ``preclint probe --backend inductor``).
"""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, Location, sci
from preclint.predict.ordinary import FLOAT32_NOISE  # a compiled-vs-eager difference under it is reassociation
from preclint.rules.base import Example, Rule


def _deliberate_rounding():
    """The code rounds a value to bfloat16 on purpose (as a bfloat16 cache would store it); the
    fused kernel Inductor makes reads the value in float32 instead."""
    import torch

    class Rounding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)

        def forward(self, x):
            y = self.a(x).float() * 0.5
            stored = y.to(torch.bfloat16).float()
            return stored * 3.0 + y

    torch.manual_seed(0)
    return Rounding().eval(), (torch.randn(32, 64),)


def _kept_softmax():
    """A softmax the code keeps in float32 (autocast off, ``.float()``): the compiled graph keeps it."""
    import torch

    class Kept(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(64, 64)
            self.out = torch.nn.Linear(64, 64)

        def forward(self, x):
            scores = self.q(x) * 8.0
            with torch.autocast(x.device.type, enabled=False):
                weights = torch.softmax(scores.float() * 2.0, dim=-1)
            return self.out(weights)

    torch.manual_seed(0)
    return Kept().eval(), (torch.randn(32, 64),)


class CompiledPrecisionChange(Rule):
    code = "PCL901"
    name = "compiled-precision-change"
    summary = "The compiled graph computes a value in another precision than the model's code or plan asks for."
    severity = "warning"
    needs_probe = True
    needs = ()  # judged on the compiled run, from no statistics of the reference pass
    why = """
A compiler is free to change how a model's numbers are computed: Inductor fuses ops and keeps the
intermediates of a fused kernel in float32 where eager rounds each one to bfloat16/float16, and it
drops a downcast-upcast pair the code wrote on purpose. Three changes are reported, each with the
measured output error of the compiled model against float64 beside eager's:

- an op the code keeps in float32 (an `autocast(enabled=False)` region, a `.float()` call, a unit a
  `preclint plan` keeps) computes in a reduced format in the compiled graph;
- the compiled graph computes in a reduced format the eager run of the same precision never uses:
  a graph compiled for another precision, as a stale compilation cache returns (pytorch PR 181564:
  a graph compiled under bfloat16 autocast served to a float16 one);
- a cast of the code to bfloat16/float16 (a value rounded on purpose, as a cache would store it)
  whose rounding a fused kernel removes, where that moves the output beyond float32 noise (info).
"""
    example = """
stored = y.to(torch.bfloat16).float()   # compiled: the fused kernel reads y in float32
"""
    fix = """
Round where a buffer is stored rather than inside a fused chain, or compile with
`torch._inductor.config.emulate_precision_casts = True` to keep every rounding eager makes. For a
kept region that the graph lost, mark it with `torch.compiler.disable` or keep its inputs and ops in
float32 explicitly; for a graph of another precision, `torch._dynamo.reset()` between precisions
and clear the compile caches (TORCHINDUCTOR_FX_GRAPH_CACHE=0, TORCHINDUCTOR_AUTOGRAD_CACHE=0).
"""
    probe_bad = (
        Example(_deliberate_rounding, "a deliberate bfloat16 rounding that the fused kernel removes",
                {"precisions": ("fp16",), "backend": "inductor"}),
    )
    probe_good = (
        Example(_kept_softmax, "a softmax kept in float32, which the compiled graph keeps too",
                {"precisions": ("bf16",), "backend": "inductor"}),
    )

    def check_probe(self, ctx, result, flagged):
        compared = getattr(result, "backend", None)
        if compared is None:
            return
        for mode, m in compared.modes.items():
            if m.error is not None or m.compilation is None or m.compilation.error is not None:
                continue
            effect = (f"compiled {mode} output error {sci(m.compiled)} against float64, eager {sci(m.eager)}"
                      f" (compiled vs eager {sci(m.compiled_vs_eager)})")
            measured = {mode: ErrorFigure(m.compiled, m.compiled_max_abs)}
            for check in m.kept:
                if check.offending:
                    ops = ", ".join(f"{n.original} in {n.dtype}" for n in check.offending[:4])
                    yield self._finding(ctx, check.site, mode, measured,
                                        f"The {check.site.what} keeps float32, but the compiled {mode} graph computes "
                                        f"{len(check.offending)} of its op(s) in a reduced format ({ops}); {effect}.")
            if m.foreign_dtypes:
                yield self._finding(ctx, None, mode, measured,
                                    f"The compiled {mode} graph computes in {', '.join(m.foreign_dtypes)}, which the "
                                    f"eager {mode} run never does: a graph compiled for another precision (a stale "
                                    f"compilation); {effect}.")
            if not _moved(m):
                continue
            for check in m.casts:
                if check.offending:
                    yield self._finding(ctx, check.site, mode, measured,
                                        f"The {check.site.what} rounds on purpose, but the compiled {mode} graph "
                                        f"fuses it away (emulate_precision_casts restores eager: output error "
                                        f"{sci(m.emulated_casts)}); {effect}.", severity="info")

    def _finding(self, ctx, site, mode: str, measured, message: str, severity=None):
        """A finding at the site: the check's node where the site names one, else the user's line
        the compiled graph records for it."""
        node = ctx.graph.get(site.node) if site is not None and site.node else None
        finding = self.finding(node, message, severity=severity, precisions=(mode,))
        if node is None and site is not None and site.path:
            finding.location = Location(_shown(site.path), site.line, 1)
        finding.measured = measured
        finding.status = "confirmed"
        return finding


def _shown(path: str) -> str:
    """A path under the working directory relative to it, as findings print paths."""
    import os

    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _moved(m) -> bool:
    """Whether compiling moved the output beyond float32 noise, and emulating eager's casts takes
    back most of it: the removed roundings are what moved it."""
    if m.compiled_vs_eager is None or m.compiled_vs_eager <= FLOAT32_NOISE or m.emulated_vs_eager is None:
        return False
    return m.emulated_vs_eager < 0.5 * m.compiled_vs_eager
