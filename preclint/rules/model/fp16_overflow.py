"""PCL101 fp16-overflow."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, sci
from preclint.reference.analyses.reach import Reach
from preclint.predict.range import reaching_absmax
from preclint.rules.base import Example, Rule, readable_module_path


def _deep_residual_stack():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)

        def forward(self, x):
            return x + 3.0 * self.fc(x)  # each block triples the scale: no normalization resets it

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(16)]), (torch.randn(2, 32),)


def _scaled_activations():
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)) * 1e6)  # a unit change: |h| ~ 1 becomes 1e6

    torch.manual_seed(0)
    return Scaled(), (torch.randn(2, 16),)


def _normalized_stack():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.fc = torch.nn.Linear(32, 32)

        def forward(self, x):
            return x + self.fc(self.norm(x))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(12)]), (torch.randn(2, 32),)


def _squares():
    import torch

    class SumOfSquares(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.proj(x) * 400.0
            return (h * h).mean(dim=-1)  # x*x stays fp16 under autocast; |h| > 256 overflows

    torch.manual_seed(0)
    return SumOfSquares(), (torch.randn(4, 16),)


def _additive_mask(whole_row_masked: bool):
    def build():
        import torch

        class MaskedAttention(torch.nn.Module):
            """An additive attention mask of finfo(float32).min, as T5 and BERT build it: float16
            holds no such value, and the masked scores become -inf, which softmax turns into 0."""

            def __init__(self):
                super().__init__()
                self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

            def forward(self, x, keep):
                mask = (1.0 - keep[:, None, :].float()) * torch.finfo(torch.float32).min
                return torch.nn.functional.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), attn_mask=mask)

        torch.manual_seed(0)
        keep = torch.ones(2, 8, dtype=torch.bool)
        keep[:, 5:] = False
        if whole_row_masked:
            keep[1] = False  # every key of the second sequence masked: all -inf, softmax gives NaN
        return MaskedAttention(), (torch.randn(2, 8, 32), keep)

    return build


class Fp16Overflow(Rule):
    code = "PCL101"
    size_drift = "exploding"  # values that drift up with random-init weights
    needs = (Reach,)
    measured_as = "overflow"
    name = "fp16-overflow"
    summary = "A value leaves float16's finite range (|x| > 65504) under a precision that stores it in float16."
    severity = "error"
    precisions = ("fp16", "fp16-full")
    why = """
float16 holds magnitudes up to 65504. Activations of deep residual stacks without normalization,
attention logits before scaling, squares of values above 256, and sums over long axes pass that
limit; the value becomes inf and usually NaN a few ops later. Under autocast, convs and matmuls
produce float16, and ops that are not on autocast's float32 list (add, mul, mean, var, batch_norm)
keep computing in float16. bfloat16 has float32's range and does not overflow here.
"""
    example = """
h = self.proj(x)          # |h| ~ 400
energy = (h * h).mean(-1) # 160000 > 65504: inf under autocast(float16)
"""
    fix = """
Use bfloat16 instead of float16, keep the module that produces the large values in float32
(`with torch.autocast(device_type, enabled=False): ... x.float()`), rescale (scale queries before
QK^T, normalize residual streams), or compute squares with `pow`, which autocast runs in float32.
"""
    bad = (Example(_deep_residual_stack, "16 residual blocks that triple the scale, no normalization"),
           Example(_squares, "x*x of values around 400"),
           Example(_scaled_activations, "activations below 1 multiplied by 1e6"),
           Example(_additive_mask(True), "the same mask over every key of a sequence: a row of -inf in float16"))
    good = (Example(_normalized_stack, "the same stack with LayerNorm in each block"),
            Example(_additive_mask(False), "a finfo(float32).min attention mask that softmax turns into zeros"))

    def check_graph(self, ctx):
        graph = ctx.graph
        order = {node.name: i for i, node in enumerate(graph.nodes)}
        origins = {}  # node name -> {mode: number of later values that overflow with it}
        for mode in ctx.modes:
            overflowing = {n for n, pred in ctx.predictions[mode].nodes.items() if pred.overflow}
            for name in overflowing:
                if self._is_written_constant(graph[name]):
                    continue  # a fill or mask constant too large for float16 is PCL102's finding
                if not any(i in overflowing for i in graph[name].inputs):  # else inherited from its origin
                    origins.setdefault(name, {})[mode] = self._downstream(graph, name, overflowing)
        for name in sorted(origins, key=order.get):
            node = graph[name]
            modes = tuple(origins[name])
            downstream = max(origins[name].values())
            inputs_only = reaching_absmax(node) <= 65504
            value = max([reaching_absmax(node)] + [reaching_absmax(graph[n]) for n in node.inputs if graph.get(n) is not None
                                                   and graph[n].out is not None and graph[n].out.finite])
            message = (
                f"{ctx.display(name)} overflows float16 under {', '.join(modes)}: "
                f"{'its inputs reach' if inputs_only else 'it reaches'} {sci(value)} in the fp32 reference, "
                "above float16's 65504"
            )
            message += f", and {downstream} later values overflow with it." if downstream else "."
            owner = readable_module_path(node.module_path, ctx.model_name) or "this computation"
            fix = (f"Use bfloat16 instead of float16, or keep {owner} in float32 (autocast(enabled=False) and .float()); "
                   "or keep the values in range: normalize the residual stream, scale before the product.")
            yield self.finding(node, message, fix=fix, predicted={m: ErrorFigure(None, None) for m in modes},
                               precisions=modes)

    @staticmethod
    def _is_written_constant(node) -> bool:
        """Whether the value beyond the range is a constant the code writes (masked_fill(-1e9), full,
        a 0/1 mask times finfo.min): the output's largest magnitude is the constant itself. A large
        factor applied to smaller values (``h * 1e6`` with |h| < 1) is an overflow of the result."""
        out = node.out
        if out is None or not node.scalars:
            return False
        return any(abs(value) >= 65504 and abs(abs(value) - out.absmax) <= 1e-6 * abs(value)
                   for value in node.scalars.values())

    @staticmethod
    def _downstream(graph, origin, overflowing):
        reached, frontier = {origin}, [origin]
        while frontier:
            current = frontier.pop()
            for user in graph.users(current):
                if user.name in overflowing and user.name not in reached:
                    reached.add(user.name)
                    frontier.append(user.name)
        return len(reached) - 1
