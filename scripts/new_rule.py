"""Scaffold a rule: one new module in the rule pack, with its documentation sections (Why it matters,
Example, Fix) and the examples its tests are generated from. Nothing else to edit: the pack finds
the module, and the rule pages (docs/rules/) are regenerated.

    python scripts/new_rule.py PCL206 wide-softmax "A softmax over logits wider than its format resolves."
    python scripts/new_rule.py PCL506 deprecated-thing "..." --source --api torch.deprecated.thing
    python scripts/new_rule.py --statistic divisor-underflow "The smallest nonzero divisor of a division."

A graph rule starts as a working rule over the IR: it flags the ops of ``OPS`` whose predicted local
error exceeds ``LIMIT``, with a bad and a good example model. A source rule (``--source``) flags
references to ``--api``, with invalid and valid snippets. Replace the check, the examples and the
documentation with the rule's own; ``python -m pytest tests/rules/test_rule_examples.py
tests/rules/test_source_rules.py`` runs the examples.

A statistic (``--statistic NAME``) is one module in preclint/reference/analyses/ with its record and
its analysis: a forward analysis that sees each op's operands and result as the reference pass runs
it, or with ``--gradient`` one that hears the backward pass from the model's outputs. A rule reads it
by naming the record in its ``needs``.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RULES = ROOT / "preclint" / "rules"
ANALYSES = ROOT / "preclint" / "reference" / "analyses"

GRAPH = '''"""{code} {name}: {summary_line}"""
from __future__ import annotations

from preclint.core.findings import percent
from preclint.core.ir import Kind
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.rules.base import Example, Rule

# The ops the rule looks at (ir.Node.fn) and the predicted local error (relative to the op's RMS)
# above which it reports one; say why this bound, with the measurement behind it.
OPS = frozenset({{"linear", "matmul"}})
LIMIT = 1e-3


def _linear():
    """A linear layer: bfloat16 rounds its operands to 2^-8, above LIMIT."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64)).eval(), (torch.randn(8, 64),)


class {cls}(Rule):
    code = "{code}"
    name = "{name}"
    summary = "{summary}"
    severity = "warning"
    precisions = ()  # the modes it concerns; () = all
    # the analyses' records it reads (Terms, Gains, Reach, ... of preclint.reference.analyses): node_figure
    # reads predicted errors
    needs = PREDICTED_ERRORS_NEED
    why = """
Why the pattern changes a model's numbers under reduced precision, and by how much.
"""
    example = """
y = layer(x)   # the code that shows the pattern
"""
    fix = """
What to change. Give the change that fixes it first, as a sentence that stands alone.
"""
    bad = (Example(_linear, "a linear layer under bfloat16 autocast", {{"precisions": ("bf16",)}}),)
    good = (Example(_linear, "the same layer under TF32", {{"precisions": ("tf32",)}}),)

    def check_graph(self, ctx):
        if not ctx.graph.ran_reference:
            return
        for node in ctx.graph.nodes:
            if node.fn not in OPS or node.kind == Kind.OUTPUT:
                continue
            figures = {{mode: ctx.node_figure(node, mode) for mode in ctx.modes}}
            over = {{mode: f for mode, f in figures.items() if f.rel_error is not None and f.rel_error > LIMIT}}
            if over:
                worst = max(f.rel_error for f in over.values())
                message = f"{{ctx.display(node.name)}} rounds by {{percent(worst)}} under {{', '.join(over)}}."
                yield self.finding(node, message, predicted=over, precisions=tuple(over))
'''

SOURCE = '''"""{code} {name}: {summary_line}"""
from __future__ import annotations

from typing import Iterator

from preclint.core.findings import Finding
from preclint.rules.base import SourceRule

API = ("{api}",)  # the qualified names the rule reports


class {cls}(SourceRule):
    code = "{code}"
    name = "{name}"
    summary = "{summary}"
    severity = "warning"
    # words a file must hold to be parsed for this rule: each group must match, by any of its words
    triggers = (("{last}",),)
    why = """
Why the code changes a model's numbers under reduced precision, and by how much.
"""
    example = """
{api}(x)
"""
    fix = """
What to change. Give the change that fixes it first, as a sentence that stands alone.
"""
    valid = (
        """
import torch

y = torch.add(x, 1)
""",
    )
    invalid = (
        """
import {module}

y = {api}(x)
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        for ref, _qualified, call in source.index.references(API):
            node = call.node if call is not None else ref.node
            yield source.report(self, node, "`{api}` is used.", "Replace it.")
'''

FORWARD_STATISTIC = '''"""{summary_line}: what the record holds, how the analysis computes it, and what reads it."""
from __future__ import annotations

from dataclasses import dataclass

from preclint.capture.observer import Call
from preclint.core.ir import Kind, Node
from preclint.reference.analyses import ForwardAnalysis

# The ops whose results the statistic is taken of; say why these.
KINDS = frozenset({{Kind.ELEMENTWISE, Kind.ACTIVATION}})


@dataclass
class {cls}:
    """{summary}"""

    zero_fraction: float  # the fraction of the op's float results that are exactly zero


class {cls}Analysis(ForwardAnalysis):
    record = {cls}
    needs = ()  # the records of other analyses it reads, which then run before it

    def observe(self, node: Node, call: Call) -> None:
        # (this module imports no torch, as the rules that import its record must not: tensor methods
        # need none, and a function that needs torch imports it where it computes)
        output = call.outputs[0] if call.outputs else None
        if node.kind not in KINDS or output is None or not output.is_floating_point() or not output.numel():
            return
        node.put({cls}(float((output == 0).float().mean())))
'''

GRADIENT_STATISTIC = '''"""{summary_line}: what the record holds, how the analysis computes it, and what reads it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from preclint.reference.analyses import GradientAnalysis


@dataclass
class {cls}:
    """{summary}"""

    largest: float  # the largest gradient magnitude of the node's value in the pass from the model's outputs


class {cls}Analysis(GradientAnalysis):
    record = {cls}
    needs = ()  # the records of other analyses it reads, which then run before it

    # watch(node, call) would add operands of an op to what the passes weigh (analyses/gains.py
    # watches those of dot products); passes.run(roots, listeners) in finish runs passes of its own.

    def listen(self, passes) -> Optional["{cls}Analysis"]:
        """Hear the pass from the model's outputs (on_grad; on_operand_grad for watched operands)."""
        self.largest: Dict[str, float] = {{}}
        return self

    def on_grad(self, name: str, value, grad) -> None:
        if grad.numel():
            self.largest[name] = max(self.largest.get(name, 0.0), float(grad.detach().abs().max()))

    def finish(self, graph, passes) -> None:
        if passes.main() is None:  # no float output has a gradient
            return
        for name, largest in self.largest.items():
            node = graph.get(name)
            if node is not None:
                node.put({cls}(largest))
'''


def module_name(name: str) -> str:
    return name.replace("-", "_")


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[-_]", name))


def render(code: str, name: str, summary: str, source: bool = False, api: str = "torch.example") -> str:
    values = dict(code=code, name=name, cls=class_name(name), summary=summary.replace('"', '\\"'),
                  summary_line=summary.rstrip("."), api=api, last=api.rsplit(".", 1)[-1], module=api.split(".")[0])
    return (SOURCE if source else GRAPH).format(**values)


def scaffold(code: str, name: str, summary: str, directory: "pathlib.Path | None" = None, source: bool = False,
             api: str = "torch.example") -> pathlib.Path:
    """Write the rule's module into ``directory`` (the pack's ``source/`` or ``model/``); ValueError for a
    taken or malformed code or name."""
    if directory is None:
        directory = RULES / ("source" if source else "model")
    from preclint.rules import all_rules, rediscover

    if not re.match(r"^PCL[0-9]{3}$", code):
        raise ValueError(f"a rule code is PCL and three digits, not {code!r}")
    if not re.match(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$", name):
        raise ValueError(f"a rule name is kebab-case, not {name!r}")
    if not summary.strip():
        raise ValueError("give the rule a one-line summary")
    rules = all_rules()
    if code in rules:
        raise ValueError(f"{code} is {rules[code].name}; codes are never reused")
    if any(rule.name == name for rule in rules.values()):
        raise ValueError(f"a rule is already named {name}")
    path = directory / f"{module_name(name)}.py"
    if path.exists():
        raise ValueError(f"{path} exists")
    path.write_text(render(code, name, summary.strip(), source, api), encoding="utf-8")
    rediscover()
    return path


def scaffold_statistic(name: str, summary: str, directory: "pathlib.Path | None" = None,
                       gradient: bool = False) -> pathlib.Path:
    """Write a statistic's module (its record and its analysis) into ``directory`` (the analyses'
    package); ValueError for a malformed name or one an analysis, a record or a module has."""
    directory = ANALYSES if directory is None else directory
    from preclint.reference.analyses import every_analysis, rediscover

    if not re.match(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$", name):
        raise ValueError(f"a statistic's name is kebab-case, not {name!r}")
    if not summary.strip():
        raise ValueError("give the statistic a one-line summary")
    record = class_name(name)
    taken = {a.__name__ for a in every_analysis()} | {a.record.__name__ for a in every_analysis()}
    if record in taken or f"{record}Analysis" in taken:
        raise ValueError(f"an analysis or a record is already named {record}")
    path = directory / f"{module_name(name)}.py"
    if path.exists():
        raise ValueError(f"{path} exists")
    template = GRADIENT_STATISTIC if gradient else FORWARD_STATISTIC
    summary = summary.strip()
    path.write_text(template.format(cls=record, summary=summary.replace('"', '\\"'), summary_line=summary.rstrip(".")),
                    encoding="utf-8")
    rediscover()
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                     usage="%(prog)s CODE NAME SUMMARY [--source [--api API]]\n"
                                           "       %(prog)s --statistic NAME SUMMARY [--gradient]")
    parser.add_argument("words", nargs="+", metavar="CODE NAME SUMMARY",
                        help="a rule's code (PCL and three digits: 0 model-level, 1 range, 2 accuracy, 3 decisions, "
                             "5 source), its kebab-case name (wide-softmax) and a one-line summary; with "
                             "--statistic, the summary alone")
    parser.add_argument("--source", action="store_true", help="a source rule (libcst) rather than a graph rule")
    parser.add_argument("--api", default="torch.example", help="for --source: the qualified name it reports")
    parser.add_argument("--statistic", metavar="NAME", help="scaffold a statistic (an analysis and its record), not a rule")
    parser.add_argument("--gradient", action="store_true", help="for --statistic: one of the backward passes")
    args = parser.parse_args(argv)
    if args.statistic is not None:
        if len(args.words) != 1 or args.source:
            parser.error("--statistic NAME takes one SUMMARY (and --gradient), no rule code or name")
        try:
            path = scaffold_statistic(args.statistic, args.words[0], gradient=args.gradient)
        except ValueError as exc:
            print(f"new_rule: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0
    if len(args.words) != 3 or args.gradient:
        parser.error("a rule takes CODE NAME SUMMARY (--gradient is for --statistic)")
    try:
        path = scaffold(*args.words, source=args.source, api=args.api)
    except ValueError as exc:
        print(f"new_rule: {exc}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "scripts"))
    import rule_table

    rule_table.main([])
    print(f"wrote {path.relative_to(ROOT)} and the rule pages (docs/rules/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
