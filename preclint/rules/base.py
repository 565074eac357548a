"""What a rule is. Rules live in the rule pack (rules/, installed as preclint.rules).

Rule modules must not import torch at module level: `preclint rule` and the source-only path load
the pack without it. Example models import torch inside their builders.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterator, Optional, Pattern, Sequence, Tuple, Union

from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.core.numerics import gaussian_max_factor

if TYPE_CHECKING:
    from preclint.core.ir import Graph, Node
    from preclint.predict.error_model import ModePrediction


@dataclass
class Example:
    """A model that a rule's tests run: ``build()`` returns ``(module, example_inputs)``.

    ``options`` are check options (precisions, rtol, atol) the example needs.
    """

    build: Callable[[], Tuple[Any, tuple]]
    description: str = ""
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RuleContext:
    """What a graph rule sees: the graph, the predictions per mode, and the options of this run.

    ``modes`` are the checked precisions the rule concerns (its ``precisions``): the engine never
    shows a rule a mode it did not declare.
    """

    graph: "Graph"
    modes: Tuple[str, ...]
    predictions: Dict[str, "ModePrediction"]
    rtol: Optional[float] = None
    atol: Optional[float] = None
    model_location: Optional[Location] = None
    model_name: str = "model"  # what the user's file calls the model: ``model[0]`` names its first entry
    # --train: each precision's predicted training-step figures (predict/training.py TrainingFigures), and
    # the float64 reference step they came from (reference/training_step.py), which the probe measures against
    training: Dict[str, Any] = field(default_factory=dict)
    training_reference: Optional[Any] = None

    def for_rule(self, rule: "type[RuleDoc]") -> "RuleContext":
        """This context as ``rule`` sees it: only the modes among its ``precisions``."""
        if not rule.precisions:
            return self
        return dataclasses.replace(self, modes=tuple(m for m in self.modes if m in rule.precisions))

    def node_figure(self, node: "Node", mode: str) -> ErrorFigure:
        """The node's own (local) predicted error under ``mode``: relative to its RMS, and max-abs."""

        local = self.predictions[mode].nodes[node.name].local
        out = node.out
        if out is None or out.rms == 0:
            return ErrorFigure(None, None)
        return ErrorFigure(local / out.rms, local * gaussian_max_factor(out.numel))

    def output_figure(self, mode: str) -> ErrorFigure:
        p = self.predictions[mode]
        return ErrorFigure(p.rel_error, p.max_abs_error)

    def display(self, name: str) -> str:
        """A node as users know it: its module path, else its op and the module that calls it."""
        node = self.graph.get(name)
        if node is None:
            return name
        path = readable_module_path(node.module_path, self.model_name)
        if node.module_path and node.target.startswith("nn."):
            # an entry of a container the user built (``model[0]``) says what it is, as ``conv1`` does
            return f"{path} ({node.module_type})" if path != node.module_path and node.module_type else path
        # an op of the root module's own forward is named with the root's class
        where = f" in {path}" if node.module_path else (f" in {node.module_type}" if node.module_type else "")
        return f"{node.target}{where}" if node.kind != "input" else f"the input {name}"


def readable_module_path(path: str, model_name: str = "model") -> str:
    """A module path as the user indexes it where it starts inside a container the model is (an
    ``nn.Sequential`` of torch's layers): ``0.conv`` is ``model[0].conv``; other paths as they are."""
    parts = path.split(".") if path else []
    if not parts or not parts[0].isdigit():
        return path
    text = model_name
    for part in parts:
        text += f"[{part}]" if part.isdigit() else f".{part}"
    return text


# What the probe compares a graph rule's prediction with (Rule.measured_as), and when the finding is
# confirmed (preclint.probe.verdict):
MEASURED_AS = {
    "received": "the error the node's value carries; confirmed when measured >= predicted / 3",
    "local": "the node's own (local) error; confirmed when measured >= predicted / 3",
    "output": "the output of each mode's full run; confirmed when some element fails |atol + rtol |ref||",
    "reference": "the node in float64 and in each mode; confirmed when it is inf/NaN there too",
    "overflow": "the node in the mode's run; confirmed when it is inf/NaN there (the reference is finite)",
    "flips": "the decisions of the mode's run (else its detections); confirmed when at least one flipped",
    "training": "the training step's measured figure (Rule.training_figure) against a float64 step; confirmed "
                "when it is over the rule's threshold too",
}


class RuleDoc:
    """Identity and documentation, shared by graph and source rules: everything the engine, the
    reports and the tests read of a rule is declared here or on Rule / SourceRule, with its default."""

    code: ClassVar[str]  # PCL + three digits; never reused or renumbered
    name: ClassVar[str]  # kebab-case
    summary: ClassVar[str]  # one line
    severity: ClassVar[str] = "warning"  # default; a finding may raise or lower it
    # The precisions it concerns; () = all. A graph rule sees only these modes (RuleContext.modes)
    # and does not run when none of them is checked.
    precisions: ClassVar[Tuple[str, ...]] = ()
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
    """A graph rule: reads the IR (and the predictions) in ``check_graph`` and yields Findings; a rule
    that judges measurements rather than predictions reads a probe's result in ``check_probe``. It
    declares the analyses' records it reads in ``needs``.

    ``bad``/``good`` are example models: the tests assert that each bad one raises this rule at
    default settings (plus its options) and each good one does not. A rule that needs a probe
    (``needs_probe``) has ``probe_bad``/``probe_good`` instead, run by the probe's tests.
    """

    bad: ClassVar[Sequence[Example]] = ()
    good: ClassVar[Sequence[Example]] = ()
    # The records (Terms, Gains, Reach, ..., each beside its analysis in preclint.reference.analyses) it
    # reads off the nodes: the engine computes only the analyses the selected rules need. A rule that
    # reads predicted errors needs what they read (preclint.predict.error_model.PREDICTED_ERRORS_NEED).
    # None: every record.
    needs: ClassVar[Optional[Tuple[type, ...]]] = None
    needs_probe: ClassVar[bool] = False  # fires only on measurements (check_probe), never on a plain check
    probe_bad: ClassVar[Sequence[Example]] = ()
    probe_good: ClassVar[Sequence[Example]] = ()
    measured_as: ClassVar[str] = "received"  # a key of MEASURED_AS: what the probe confirms a finding by
    # "vanishing" or "exploding": the finding is about values too small or too large for a format, so
    # where random-init activations drift that way (reference/degenerate.py) it may describe the weights
    size_drift: ClassVar[Optional[str]] = None
    # measured_as "training": the figure of the measured step (predict/training.py TrainingFigures) that
    # confirms the finding when it is above the rule's threshold (None: the step measures nothing it predicts)
    training_figure: ClassVar[Optional[str]] = None
    # the share above which that figure confirms (None: the training rules' SHARE, rules/model/_training.py)
    training_share: ClassVar[Optional[float]] = None

    def check_graph(self, ctx: RuleContext) -> Iterator[Finding]:
        """The findings the graph and the predictions give."""
        return iter(())

    def check_probe(self, ctx: RuleContext, result, flagged: frozenset) -> Iterator[Finding]:
        """The findings a probe's measurements give (``result``: a probe.ledger.ProbeResult);
        ``flagged``: the nodes some finding of the check already names. Called after the check's
        findings are judged, and only when the output is not degenerate."""
        return iter(())

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
    # Words (or compiled regexes) a file must hold for the rule to look at it: every group must match,
    # by any of its items; a word counts only when it is not part of a longer one. () = every file.
    triggers: ClassVar[Tuple[Tuple[Union[str, Pattern[str]], ...], ...]] = ()
    # Reported by the runner itself, not by check_source on each file: where a file cannot be read
    # or parsed (reports_unreadable_files), or after suppressions are applied
    # (reports_unused_suppressions).
    after_suppressions: ClassVar[bool] = False
    # Its findings (made by ``unreadable_file``) are shown unless the configuration ignores the code
    # explicitly, even when nothing selects it: a file nobody could check must not pass silently.
    reports_unreadable_files: ClassVar[bool] = False
    reports_unused_suppressions: ClassVar[bool] = False  # made by ``unused_suppression``

    def check_source(self, source) -> Iterator[Finding]:  # source: preclint.text.sourcefile.SourceFile
        raise NotImplementedError

    @classmethod
    def unreadable_file(cls, path: str, message: str, line: int = 1, column: int = 1) -> Finding:
        """The finding for a file that could not be read or parsed (``message`` says why)."""
        raise NotImplementedError(f"{cls.code} does not report unreadable files")

    @classmethod
    def unused_suppression(cls, location: Location, unused: Sequence[str], unknown: Sequence[str]) -> Finding:
        """The finding for a suppression comment at ``location`` whose codes ``unused`` silenced
        nothing and ``unknown`` name no rule (both empty: a blanket comment that silenced nothing)."""
        raise NotImplementedError(f"{cls.code} does not report unused suppressions")


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


def markdown_table(rules: Sequence[type], link: bool = False) -> str:
    """The rule table of the rule index (docs/rules/README.md): one row a rule, from its declared code,
    name and summary; ``link``: each code links to the rule's page beside the index."""
    rows = ["| code | name | checks | what |", "|---|---|---|---|"]
    for rule in sorted(rules, key=lambda r: r.code):
        checks = "source" if issubclass(rule, SourceRule) else "`--probe`" if rule.needs_probe else "model"
        summary = " ".join(rule.summary.split()).replace("|", "\\|")
        code = f"[{rule.code}]({rule.code}.md)" if link else rule.code
        rows.append(f"| {code} | {rule.name} | {checks} | {summary} |")
    return "\n".join(rows) + "\n"
