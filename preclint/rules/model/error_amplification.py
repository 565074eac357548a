"""PCL204 error-amplification."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, percent, sci
# AMPLIFICATION_LIMIT: the factor from which an op is reported (10: beyond ordinary ops and preclint's
# factor of 3); judged_amplification leaves out amplifiers PCL203 and PCL103 explain better (sums, dot
# products, batch norms), so that the received-error passes go to the ops judged here
from preclint.reference.analyses.received_gains import AMPLIFICATION_LIMIT, ReceivedGains, judged_amplification
from preclint.core.numerics import C_OUTPUT, MODES, gaussian_max_factor
from preclint.predict.error_model import PREDICTED_ERRORS_NEED, passed_on, relative_errors
from preclint.rules.base import Example, Rule
from preclint.rules.model._norun import undecided
from preclint.rules.model._dataflow import ancestors
from preclint.reference.analyses.gains import Gains

# the share of a mode's predicted output error (RMS) from which an amplifier is a warning: below it, the
# amplified error is the op's own business, and the finding is information
OUTPUT_SHARE = 1.0 / 3.0
# ops that can magnify error, named under --no-run where their amplification cannot be measured
TYPICAL_AMPLIFIERS = frozenset({"softmax", "log_softmax", "exp", "sub", "layer_norm", "group_norm", "sigmoid",
                                "cos", "sin", "tan", "log", "pow", "rsub"})


def _attention_weights(shared: float):
    def build():
        import torch

        class Attention(torch.nn.Module):
            """Attention weights of tokens that share a large common component (as massive activations
            in trained transformers do): every score is large, their differences are not."""

            def __init__(self):
                super().__init__()
                self.q = torch.nn.Linear(64, 64)
                self.k = torch.nn.Linear(64, 64)

            def forward(self, x):
                scores = self.q(x) @ self.k(x).transpose(-2, -1) / 8.0
                return torch.softmax(scores, dim=-1)

        torch.manual_seed(0)
        model = Attention()
        with torch.no_grad():
            common = torch.randn(64)
            model.q.bias.copy_(common * shared)
            model.k.bias.copy_(common * shared)
        return model, (torch.randn(2, 16, 64),)

    return build


def _offset_layer_norm(offset: float):
    def build():
        import torch

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(64, 64)
                self.norm = torch.nn.LayerNorm(64)

            def forward(self, x):
                return self.norm(self.proj(x) + offset)  # a large common offset that the norm removes

        torch.manual_seed(0)
        return Encoder(), (torch.randn(8, 64),)

    return build


class ErrorAmplification(Rule):
    code = "PCL204"
    needs = PREDICTED_ERRORS_NEED + (ReceivedGains,)
    name = "error-amplification"
    summary = "An op multiplies the relative error it receives many times over: softmax or exp of wide logits, removal of a large common offset."
    severity = "warning"
    why = """
Most ops pass relative error on unchanged: a product, a division, a random conv. Some magnify it.
`exp`, `softmax` and `sigmoid` turn a relative error r of a logit z into an error of r*|z| in the
exponent, so logits in the tens magnify it tens of times; subtracting a large common offset (a
normalization of values that sit far from zero, `x - x.mean()` of such values, `a - b` with a close
to b) divides the result by the offset; `cos`/`sin` of large angles multiply it by the angle. The
rounding upstream is then no longer ordinary: a float16 error of 5e-4 becomes 1e-2. Division by a
small value magnifies what its divisor's producer got wrong, and preclint reports it there. preclint
reads each op's amplification from the gradients of the reference pass (how much more the output
depends on the op's inputs than on its result) and names the upstream layers whose error is
magnified. The error leaving the op is weighed along every path from every rounding (a difference of
two elements of one cumulative sum shares, and cancels, the prefix's error), and the finding is a
warning only where that error makes a third or more of the predicted output error (information
otherwise: the op amplifies, the output does not feel it).
"""
    example = """
scores = q @ k.transpose(-2, -1)     # all about 150, differences about 3 (a shared component)
p = torch.softmax(scores, dim=-1)    # relative error of the scores x ~50
y = norm(h + 300.0)                  # LayerNorm removes the offset: relative error x ~500
"""
    fix = """
Keep the values that reach the amplifying op in float32 (or compute the op and its inputs in
float32), remove large offsets before they are rounded (center inputs, subtract the max before exp),
or scale logits down (temperature, 1/sqrt(d) for attention).
"""
    bad = (Example(_attention_weights(4.0), "softmax of attention scores that share a large common part"),
           Example(_offset_layer_norm(300.0), "LayerNorm of activations sitting 300 away from zero"))
    good = (Example(_attention_weights(0.0), "softmax of ordinary attention scores"),
            Example(_offset_layer_norm(0.0), "LayerNorm of centred activations"))

    def check_graph(self, ctx):
        graph = ctx.graph
        if not graph.ran_reference:
            amplifiers = [n for n in graph.nodes if n.fn in TYPICAL_AMPLIFIERS]
            yield from undecided(self, ctx, amplifiers, "error amplification",
                                 "the gradients that measure how much each op magnifies its input's error")
            return
        received = {}
        for node in graph.nodes:
            if judged_amplification(node) is None:
                continue
            figures = {}
            for mode in ctx.modes:
                if mode not in received:
                    received[mode] = relative_errors(graph, ctx.predictions[mode])
                # the inputs' errors along every path where a pass toward them tells (ReceivedGains),
                # else as estimated op by op
                along_paths = ctx.predictions[mode].nodes[node.name].inputs_received
                arriving = {n: along_paths.get(n, received[mode].get(n, 0.0)) for n in node.inputs}
                incoming = max(arriving.values(), default=0.0)
                # the error that leaves along every path where a pass from the op's result tells (inputs
                # whose errors share an origin cancel there), else each input's error as the op amplifies
                # that input: a broadcast gate or a bias table the op amplifies does not amplify the
                # activation beside it
                leaving = ctx.predictions[mode].nodes[node.name].leaving
                outgoing = leaving if leaving is not None else passed_on(node, arriving)
                # reported where the error that leaves is beyond ordinary too: an order of magnitude
                # above what storing the op's own result in the mode's format would cost
                ordinary = C_OUTPUT * (MODES[mode].low or MODES[mode].dot_format).unit_roundoff
                if outgoing >= AMPLIFICATION_LIMIT * incoming and outgoing >= AMPLIFICATION_LIMIT * ordinary:
                    figures[mode] = (incoming, outgoing)
            if figures:
                mode = max(figures, key=lambda m: figures[m][1])
                incoming, outgoing = figures[mode]
                yield self._finding(ctx, node, outgoing / incoming, figures)

    @staticmethod
    def _output_share(ctx, node, mode, outgoing):
        """The fraction of the mode's predicted output error (RMS) that the error leaving ``node`` makes
        there, by the node's gain to the output; None where the gains do not tell."""

        gains, prediction = node.record(Gains), ctx.predictions[mode]
        if gains is None or not prediction.output_error or node.out is None:
            return None
        return min(1.0, (outgoing**2 * gains.out) ** 0.5 / prediction.output_error)

    def _finding(self, ctx, node, factor, figures):
        mode = max(figures, key=lambda m: figures[m][1])
        incoming, outgoing = figures[mode]
        upstream = ancestors(ctx.graph, node.name)
        shares = ctx.predictions[mode].contributions
        top = sorted((n for n in upstream if shares.get(n, 0) >= 0.01), key=lambda n: (-shares[n], n))[:3]
        sources = ", ".join(f"{ctx.display(n)} ({percent(shares[n])} of the output error)" for n in top)
        message = (f"{ctx.display(node.name)} amplifies the relative error of its input {sci(factor)} times: "
                   f"under {mode} the {sci(incoming)} it receives leaves as {sci(outgoing)}")
        message += f", magnifying the rounding of {sources}." if sources else "."
        # a warning fails a check: only where the amplified error matters at the output, a third of its
        # predicted error or more (Mamba2's decays: 0.1 at the op, a few percent of the output's error)
        severity = None
        share = self._output_share(ctx, node, mode, outgoing)
        if share is not None and share < OUTPUT_SHARE:
            severity = "info"
            message += (f" It makes {percent(share)} of the predicted {mode} output error, so it is reported "
                        "for information.")
        out = node.out
        predicted = {m: ErrorFigure(o, o * out.rms * gaussian_max_factor(out.numel) if out is not None else None)
                     for m, (_, o) in figures.items()}
        return self.finding(node, message, predicted=predicted, precisions=tuple(figures), severity=severity)
