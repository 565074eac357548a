"""What a rule is. Rules live in the rule pack (rules/, installed as preclint.rules).

Rule modules must not import torch at module level: `preclint rule` and the source-only path load
the pack without it. Example models import torch inside their builders.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Sequence, Tuple

from preclint.findings import ErrorFigure, Finding, Location


@dataclass
class Example:
    """A model that a rule's tests run: ``build()`` returns ``(module, example_inputs)``.

    ``options`` are check options (precisions, rtol, atol) the example needs.
    """

    build: Callable[[], Tuple[Any, tuple]]
    description: str = ""
    options: Dict[str, Any] = field(default_factory=dict)


class RuleDoc:
    """Identity and documentation, shared by graph and source rules."""

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]  # one line
    severity: ClassVar[str] = "warning"  # default; a finding may raise or lower it
    precisions: ClassVar[Tuple[str, ...]] = ()  # the modes it concerns; () = all
    why: ClassVar[str]  # "Why it matters"
    example: ClassVar[str]  # "Example": a short code snippet
    fix: ClassVar[str]  # "Fix"
    fixable: ClassVar[bool] = False

    @classmethod
    def documentation(cls) -> str:
        return (
            f"{cls.code} {cls.name}\n\n{cls.summary}\n\n"
            f"Why it matters\n{_indent(cls.why)}\n\nExample\n{_indent(cls.example)}\n\nFix\n{_indent(cls.fix)}\n"
        )


class Rule(RuleDoc):
    """A graph rule: reads the IR (and the predictions) and yields Findings.

    Override ``check`` for per-node rules, or ``check_graph`` for model-level ones.
    ``bad``/``good`` are example models: the tests assert that each bad one raises this rule at
    default settings (plus its options) and each good one does not.
    """

    bad: ClassVar[Sequence[Example]] = ()
    good: ClassVar[Sequence[Example]] = ()

    def check(self, node, ctx) -> Iterator[Finding]:
        return iter(())

    def check_graph(self, ctx) -> Iterator[Finding]:
        for node in ctx.graph.nodes:
            yield from self.check(node, ctx)

    def finding(
        self,
        node,
        message: str,
        fix: Optional[str] = None,
        predicted: Optional[Dict[str, ErrorFigure]] = None,
        severity: Optional[str] = None,
        precisions: Sequence[str] = (),
    ) -> Finding:
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            message=message,
            fix=fix or _first_sentence(self.fix),
            location=node.location if node is not None else None,
            precisions=tuple(precisions),
            module=node.module_path if node is not None else "",
            op=node.target if node is not None else "",
            predicted=dict(predicted or {}),
            node=node.name if node is not None else "",
        )


class SourceRule(RuleDoc):
    """A source rule: reads one parsed file with libcst, never imports or runs it.

    ``valid``/``invalid`` are code snippets; the tests assert the rule stays silent on each valid one
    and reports each invalid one.
    """

    valid: ClassVar[Sequence[str]] = ()
    invalid: ClassVar[Sequence[str]] = ()

    def check_source(self, source) -> Iterator[Finding]:  # source: preclint.source.SourceFile
        raise NotImplementedError


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in text.strip("\n").splitlines())


def _first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence outside `code`."""
    text = " ".join(text.split())
    in_code = False
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        elif ch == "." and not in_code and (i + 1 == len(text) or (text[i + 1] == " " and text[i - 1] != ".")):
            return text[: i + 1]
    return text
