"""PCL205 backend-dependent-kernel."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure
from preclint.core.ir import Kind
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.rules.base import Example, Rule

_FACTS = {
    "depthwise": (
        "On an H200 with cuDNN 9, depthwise convolutions ran with no TF32 kernel (fp32-sized error under TF32), "
        "while oneDNN, MIOpen and some exported engines have used float16 accumulators for them"
    ),
    "grouped": (
        "On an H200 with cuDNN 9, grouped convolutions used TF32 and fp32 accumulation like dense ones, "
        "while other backends and exported engines pick kernels with float16 accumulators for small groups"
    ),
    "patch-embedding": (
        "On an H200 with cuDNN 9, this patch-embedding shape (kernel == stride) ran with no TF32 kernel, while "
        "TensorRT FP16 engines pick tactics by speed and have computed it in FP32 or with FP16 accumulation"
    ),
}


def conv_family(node):
    """'depthwise', 'grouped', 'patch-embedding' or None for a conv node."""
    attrs = node.attrs
    groups = node.groups or 1
    in_channels = attrs.get("in_channels")
    if groups > 1:
        return "depthwise" if in_channels is not None and groups == in_channels else "grouped"
    kernel, stride = attrs.get("kernel_size"), attrs.get("stride")
    if kernel and stride and len(stride) == 1:
        stride = tuple(stride) * len(kernel)
    if kernel and stride and tuple(kernel) == tuple(stride) and max(kernel) > 1:
        return "patch-embedding"
    return None


def _mobilenet_block():
    import torch

    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 1),
    )
    return block.eval(), (torch.rand(1, 16, 32, 32),)


def _dense_block():
    import torch

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
    return block.eval(), (torch.rand(1, 16, 32, 32),)


class BackendDependentKernel(Rule):
    code = "PCL205"
    needs = PREDICTED_ERRORS_NEED
    measured_as = "local"
    name = "backend-dependent-kernel"
    summary = "Grouped, depthwise and patch-embedding convolutions whose reduced-precision behaviour depends on the kernel the backend picks."
    severity = "info"
    # Under TF32 and autocast on cuDNN these convolutions measured no worse than dense ones (depthwise
    # and patch embeddings even skipped TF32), so there the pattern is ordinary rounding. Whole-model
    # casts are what exported engines run, and there the engine picks the kernel.
    precisions = ("fp16-full", "bf16-full")
    why = """
A dense convolution runs on the same few kernels everywhere. Grouped and depthwise convolutions,
and patch embeddings (kernel == stride on a few input channels), are served by special kernels
whose precision differs by backend and version: on an H200 with cuDNN 9 depthwise and patch-
embedding convolutions did not use TF32 at all, while oneDNN and MIOpen have accumulated small-
channel float16 convolutions in float16 and TensorRT picks FP32 or FP16 tactics by speed. The
static prediction is therefore an upper bound for TF32 and a lower bound where the backend
accumulates in float16; `preclint check --probe` measures what the kernel did. The rule reports
for whole-model casts (fp16-full, bf16-full: what exported engines such as TensorRT run), where the
engine chooses the kernel; under TF32 and autocast on cuDNN these convolutions were measured no
worse than dense ones.
"""
    example = """
nn.Conv2d(64, 64, 3, groups=64)        # depthwise
nn.Conv2d(3, 384, 14, stride=14)       # ViT patch embedding
"""
    fix = """
Run `preclint check --probe` on the target device to see which kernel ran and its error. Where a
backend accumulates in float16, keep these layers in float32, or compute a patch embedding as
unfold + linear, which is exact when stride == kernel.
"""
    bad = (Example(_mobilenet_block, "a depthwise separable block exported in float16", {"precisions": ("fp16-full",)}),)
    good = (Example(_dense_block, "a dense 3x3 conv exported in float16", {"precisions": ("fp16-full",)}),
            Example(_mobilenet_block, "the depthwise block under autocast on cuDNN", {"precisions": ("tf32", "fp16", "bf16")}))

    def check_graph(self, ctx):
        modes = ctx.modes
        families = {}
        for node in ctx.graph.nodes:
            if node.kind == Kind.CONV:
                family = conv_family(node)
                if family:
                    families.setdefault(family, []).append(node)
        for family, nodes in families.items():
            names = [ctx.display(n.name) for n in nodes]
            listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            count = f"{len(nodes)} {family} convolution{'s' if len(nodes) > 1 else ''}"
            predicted = {}
            if ctx.graph.ran_reference:
                for mode in modes:
                    figures = [ctx.node_figure(n, mode) for n in nodes]
                    rels = [f.rel_error for f in figures if f.rel_error is not None]
                    abss = [f.max_abs_error for f in figures if f.max_abs_error is not None]
                    predicted[mode] = ErrorFigure(max(rels) if rels else None, max(abss) if abss else None)
            message = f"{count} ({listed}) run on kernels the backend chooses. {_FACTS[family]}."
            yield self.finding(nodes[0], message, predicted=predicted, precisions=modes)
