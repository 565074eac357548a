"""PCL109 format-unsupported-layer: a block-scaled format the deployment backends do not run on a kind
of layer (NVFP4 on convolutions)."""
from __future__ import annotations

from preclint.core.findings import percent
from preclint.core.numerics import MODES
from preclint.rules.base import Example, Rule
from preclint.predict.flops import flop_shares

# The formats with layers they cannot run (Mode.unsupported), cheapest first as the plan lists them
LIMITED = tuple(sorted((name for name, mode in MODES.items() if mode.unsupported),
                       key=lambda name: MODES[name].bits_per_element))
MIN_SHARE = 0.10  # convolutions doing less than this share of the multiply-adds change little


def _cnn(with_head_only: bool):
    def build():
        import torch

        torch.manual_seed(0)
        if with_head_only:
            return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 64)).eval(), (torch.randn(2, 3, 16, 16),)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 16))
        return model.eval(), (torch.randn(2, 3, 16, 16),)

    return build


class FormatUnsupportedLayer(Rule):
    code = "PCL109"
    name = "format-unsupported-layer"
    summary = "The model's convolutions hold most of its work, and NVFP4/MXFP8 run on its linear layers only."
    severity = "info"
    precisions = LIMITED
    needs = ()
    measured_as = "local"
    why = """
NVFP4 and MXFP8 are GEMM formats: TensorRT runs no NVFP4 convolution (ModelOpt's ONNX PTQ of vision
CNNs fails on it), and torchao's MX and NVFP4 recipes convert nn.Linear layers only. A CNN checked
under these modes keeps its convolutions in bfloat16, so neither the speed-up nor the error of the
format applies to most of its work.
"""
    example = """
model = torchvision.models.resnet50()   # 99% of the multiply-adds in Conv2d: NVFP4 converts the fc only
"""
    fix = """
Check the convolutions under fp8 (TensorRT runs FP8 convolutions) or bf16, and the linear layers
under nvfp4; or lower the convolutions to GEMMs (im2col) where the backend allows.
"""
    bad = (Example(_cnn(False), "two 3x3 convolutions and a small head", {"precisions": ("nvfp4",)}),)
    good = (Example(_cnn(True), "a linear model on the same images", {"precisions": ("nvfp4",)}),)

    def check_graph(self, ctx):
        shares = flop_shares(ctx.graph)
        for mode in ctx.modes:
            kinds = MODES[mode].unsupported
            layers = [n for n in ctx.graph.nodes if n.kind in kinds and n.name in shares]
            share = sum(shares[n.name] for n in layers)
            if not layers or share < MIN_SHARE:
                continue
            largest = max(layers, key=lambda n: shares[n.name])
            message = (f"{len(layers)} convolution{'s' if len(layers) > 1 else ''} do {percent(share)} of the model's "
                       f"multiply-adds and run no {mode} (TensorRT has no NVFP4 convolution; torchao converts "
                       f"nn.Linear only): they stay in bfloat16, the largest {ctx.display(largest.name)}.")
            yield self.finding(largest, message, predicted={mode: ctx.node_figure(largest, mode)}, precisions=(mode,))
