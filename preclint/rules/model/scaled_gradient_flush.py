"""PCL605 scaled-gradient-flush: an FP8 training recipe's gradient scale flushes most of a layer's output gradient."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.numerics import MODES, ELEMENT_FORMATS
from preclint.rules.base import Example, Rule
from preclint.rules.model._training import SCALED_TRAINING, STOCHASTIC_GRADIENTS, classifier, regression

MOST = 0.5  # of a converted layer's nonzero output-gradient values


class ScaledGradientFlush(Rule):
    code = "PCL605"
    name = "scaled-gradient-flush"
    summary = "An FP8 or NVFP4 training recipe's gradient scale flushes most of a linear layer's output gradient to 0."
    severity = "warning"
    precisions = SCALED_TRAINING
    needs = ()
    measured_as = "training"
    training_figure = "scaled_gradient_underflow"
    training_share = MOST
    why = """
An FP8 recipe quantises each linear layer's output gradient before the two backward GEMMs: scaled so that
its amax lands on the element format's largest value (one scale per tensor for `fp8`, per row for
`fp8-rowwise`, per 32 elements for `mxfp8`), then rounded. Below the amax the format keeps a fixed
span: E5M2 (`fp8`'s gradients) 2^32.8, about 7.5e9, down to half its smallest subnormal; E4M3 (the
gradients of `fp8-rowwise` and `mxfp8`) only 2^18.8, about 4.6e5. A gradient that spans more than that
loses its small values to 0: the layers before it see them flushed, and a weight whose gradient is made
only of them stops learning. A softmax over a large logit scale (a contrastive loss's 1/temperature, a
confident classifier) is the common case: the wrong classes' probabilities sit far below the right
class's. preclint quantises each converted layer's float64 output gradient as the recipe would and
counts the nonzero values that become 0 (`scaled`, per layer, in the JSON report, with the per-tensor
scale and the scales and flushed shares across blocks of 32: min, median, p99).

NVFP4 training (`nvfp4`, NVIDIA's recipe) rounds its gradients to E2M1 with an E4M3 scale per 16 values
and an fp32 scale per tensor. Inside a block E2M1 keeps only 6 / 0.25 = 24x below the block's amax, but
stochastically: a value v below the smallest step q becomes q with probability |v|/q and 0 otherwise,
so the gradient keeps its expectation and the share quoted is the expected one. A value more than about
2^19 below the tensor's amax (E4M3's span of block scales, then E2M1's own) becomes 0 almost surely,
whatever its block; the weight gradient's
operands are rotated by a random Hadamard transform first, which spreads an outlier token over its block
of 16 (`grad_output_wgrad` in the JSON report: what that GEMM reads).

Under Transformer Engine's DelayedScaling (`--scaling amax-history=N` with `fp8`) a tensor's scale comes
from the largest amax of the last N steps, and a fresh history gives 1.0: the first step reads its
gradients unscaled, and E5M2 flushes every value below 7.6e-6. preclint predicts that first step; `--probe
--steps N` measures the later ones (`scaled_gradient_underflow` per step in the trajectory).
"""
    example = """
with torchao.float8 conversion (tensorwise) or te.fp8_autocast(HYBRID):
    loss = F.cross_entropy(head(h) / 0.01, y)   # softmax gradients spread over 1e10 and more
loss.backward()                                  # the head's E5M2 gradient keeps its largest values only
"""
    fix = """
Keep the layer in bfloat16 (`--scaling keep=PATH`; torchao's `module_filter_fn`, outside Transformer
Engine's `fp8_autocast`), typically the output head; a finer gradient scale (per row, per block) helps
only where the spread is across rows or blocks, and E4M3 gradients span less than E5M2's.
"""
    bad = (Example(classifier(temperature=0.01), "a classifier whose loss divides its logits by 0.01, under fp8",
                   {"precisions": ("fp8",)}),
           Example(classifier(temperature=0.01), "the same classifier under nvfp4: the wrong classes' gradients lie "
                   "more than 2^19 below the tensor's amax", {"precisions": ("nvfp4",)}),
           Example(regression(optimizer="adam", lr=1e-3), "a regression whose gradients are near 1e-6, under fp8 with "
                   "delayed scaling: the first step's scale of 1.0 flushes them", {"precisions": ("fp8",),
                                                                                    "scaling": {"amax-history": 1024}}))
    good = (Example(classifier(), "the same classifier at temperature 1", {"precisions": ("fp8",)}),
            Example(classifier(temperature=0.01), "the temperature-0.01 classifier with its head kept in bfloat16",
                    {"precisions": ("fp8",), "scaling": {"keep": ["4"]}}),
            Example(regression(optimizer="adam", lr=1e-3), "the same regression under fp8 with current scaling",
                    {"precisions": ("fp8",)}))

    def check_graph(self, ctx):
        for mode in (m for m in ctx.training if m in self.precisions):
            figures = ctx.training[mode]
            if figures is None:
                continue
            rows = {row.parameter: row for row in figures.parameters}
            for path, stats in figures.scaled.items():
                grad = stats.get("grad_output")
                if grad is None or grad["underflow_fraction"] <= MOST:
                    continue
                yield self._finding(ctx, mode, path, grad, rows.get(f"{path}.weight" if path else "weight"), figures)

    def _finding(self, ctx, mode, path, grad, weight_row, figures):
        element = grad["element"].upper()
        blocks = grad["blocks"]
        if grad.get("delayed"):
            scale = (f"a delayed-scaling recipe's first step reads it at the scale of a fresh amax history, "
                     f"{sci(grad['tensor_scale'])} (amax {sci(grad['amax'])}), and flushes the values below "
                     f"{sci(_flush_value(grad))}")
        elif grad["granularity"] == "tensor":
            scale = (f"one scale for the tensor, {sci(grad['tensor_scale'])} (amax {sci(grad['amax'])}), flushes the values "
                     f"below {sci(_flush_value(grad))}")
        else:
            scale = f"a scale per {grad['granularity']} ({sci(grad['scale'][0])} to {sci(grad['scale'][2])}, p99)"
        spread = "/".join(percent(v) for v in blocks["underflow_fraction"])
        weight = (f"; {weight_row.parameter}'s gradient has {percent(weight_row.underflow_fraction)} of its elements "
                  "flushed" if weight_row is not None and weight_row.underflow_fraction > 0 else "")
        expected = " (in expectation: stochastic rounding)" if mode in STOCHASTIC_GRADIENTS else ""
        message = (f"layer {ctx.display(path) if path else '(the model)'} loses {percent(grad['underflow_fraction'])} of its output "
                   f"gradient's nonzero values to 0{expected} in {element} under {mode}: {scale}; flushed across blocks of "
                   f"{blocks['size']}: {spread} (min/median/p99){weight}.")
        recipe_block = MODES[mode].recipe.block if MODES[mode].recipe is not None else 0
        # a scale per block of 32 is finer only than a tensor's, a row's or a larger block's
        finer = grad["block_scaled_underflow_fraction"] if not recipe_block or recipe_block > blocks["size"] else 1.0
        keep = (f"keep {path or 'the layer'} in bfloat16 (--scaling keep={path or '...'}; torchao's module_filter_fn, or "
                "outside Transformer Engine's fp8_autocast)")
        if grad.get("delayed"):
            fix = ("Scale from the current amax (Transformer Engine's Float8CurrentScaling, torchao's dynamic scaling), "
                   f"or start the amax history from a calibration run; or {keep}.")
        else:
            fix = (keep[0].upper() + keep[1:]
                   + (f"; a scale per block of {blocks['size']} would flush {percent(finer)}" if finer < grad['underflow_fraction'] else "")
                   + ".")
        finding = self.finding(None, message, fix=fix, predicted={mode: ErrorFigure(figures.grad_rel_error, None)},
                               precisions=(mode,))
        finding.module = path
        return finding


def _flush_value(grad) -> float:
    """The magnitude below which the per-tensor scale flushes a value: half the element's smallest subnormal."""

    return ELEMENT_FORMATS[grad["element"]].min_subnormal / 2 / grad["tensor_scale"]
