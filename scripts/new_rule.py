"""Scaffold a rule: one new module in the rule pack, with its documentation sections (Why it matters,
Example, Fix) and the examples its tests are generated from. Nothing else to edit: the pack finds
the module, and the README's table is regenerated.

    python scripts/new_rule.py PCL206 wide-softmax "A softmax over logits wider than its format resolves."
    python scripts/new_rule.py PCL506 deprecated-thing "..." --source --api torch.deprecated.thing

A graph rule starts as a working rule over the IR: it flags the ops of ``OPS`` whose predicted local
error exceeds ``LIMIT``, with a bad and a good example model. A source rule (``--source``) flags
references to ``--api``, with invalid and valid snippets. Replace the check, the examples and the
documentation with the rule's own; ``python -m pytest tests/test_rule_examples.py
tests/test_source_rules.py`` runs the examples.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RULES = ROOT / "preclint" / "rules"

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
    # the analyses' records it reads (preclint.core.ir: Terms, Gains, Reach, ...): node_figure reads predicted errors
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("code", help="PCL and three digits: 0 model-level, 1 range, 2 accuracy, 3 decisions, 5 source")
    parser.add_argument("name", help="kebab-case, e.g. wide-softmax")
    parser.add_argument("summary", help="one line, a sentence")
    parser.add_argument("--source", action="store_true", help="a source rule (libcst) rather than a graph rule")
    parser.add_argument("--api", default="torch.example", help="for --source: the qualified name it reports")
    args = parser.parse_args(argv)
    try:
        path = scaffold(args.code, args.name, args.summary, source=args.source, api=args.api)
    except ValueError as exc:
        print(f"new_rule: {exc}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "scripts"))
    import rule_table

    rule_table.main([])
    print(f"wrote {path.relative_to(ROOT)} and the README's rule table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
