"""`preclint plan`: the plan-verify-refine loop, and the console, JSON and HTML output (its arguments:
plan/arguments.py). The walk that leads here (load, check) is the session's (preclint.engine)."""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from preclint.core.errors import UserError, one_line
from preclint.reference.analyses.margins import DecisionMargins
from preclint.core.findings import percent, sci
from preclint.core.numerics import MODES
from preclint.load.modelio import Inputs
from preclint.measure.copies import copy_to
from preclint.plan.document import KeepEntry
from preclint.plan.compiled_check import verify_compiled
from preclint.plan.exports import onnx_exclude_patterns
from preclint.plan.planner import make_plan, output_margins, Planner
from preclint.plan.units import Unit
from preclint.plan.verify import Verifier
from preclint.policy import apply_policy, load_policy, PolicyError
from preclint.report.escape import log_lines, visible, visible_text
from preclint.report.html import PlanSection, render_many

MAX_RUNS = 3  # runs of the model with a plan applied, the first one included


def render_plan(report, plan, fmt: str, color: bool = False) -> str:
    """The plan in ``fmt``: json, html (the check's ``report`` with the plan's section) or full."""
    if hasattr(plan, "exports"):  # a scaled format's plan (plan/scaled.py, plan/formats.py)
        if fmt == "html":
            raise UserError("a plan for a scaled format writes --output-format full or json")
        return json.dumps(plan.to_json(), indent=2) + "\n" if fmt == "json" else plan.render()
    if fmt == "json":
        return json.dumps(plan.to_json(), indent=2) + "\n"
    if fmt == "html":
        return render_many([report], plan=plan_section(plan))
    return render_console(plan, color)


def _tolerance_text(tol) -> str:
    return ", ".join(f"{k}={v}" for k, v in (("rtol", tol.rtol), ("atol", tol.atol), ("max_flip", tol.max_flip))
                     if v is not None)


def plan_section(plan):
    """The plan as the HTML report shows it: what is kept and why, and the output error before and
    after it, predicted and (when a run verified it) measured."""

    wanted = _tolerance_text(plan.tolerance)
    verdict = "meets" if plan.meets_tolerance else "does not meet"
    summary = (f"Under {plan.precision}, keeping {len(plan.keep)} unit(s) in float32 ({percent(plan.kept_flops_fraction)} "
               f"of the FLOPs) {verdict} the tolerance ({wanted})." + "".join(f" {n}" for n in plan.notes))
    rows = [(k.module or "<root>", k.op or "", k.reason + (f" (faster fix: {k.alternative})" if k.alternative else ""),
             percent(k.share) if k.share is not None else "", percent(k.flops_fraction)) for k in plan.keep]
    series = {}
    for label, figures in (("predicted", plan.predicted), ("measured", plan.measured or {})):
        values = [figures.get(when).rel_error if figures.get(when) is not None and figures.get(when).finite else None
                  for when in ("before", "after")]
        if any(v is not None for v in values):
            series[label] = values
    chart = {"x": ["before the plan", "with the plan"], "series": series,
             "y_title": "output error (relative RMS)", "log": True} if series else None
    return PlanSection(summary, ("module", "op", "reason", "share of the error", "FLOPs kept"), rows, chart)


@dataclass(frozen=True)
class PlanBasis:
    """What every plan of one model is made from: the model, the check's graph and findings, the
    precision, the tolerance, and the margins of the model's outputs (for a decision budget)."""

    loaded: Any
    graph: Any
    findings: Sequence[Any]
    mode: str
    tolerance: Any  # measure.compare.Tolerance
    margins: Sequence[float] = ()

    def make(self, margin: float = 1.0, extra_must: Sequence[Any] = ()):
        """The plan the error model chooses, its predictions asked to hold by ``margin``."""

        return make_plan(self.graph, self.mode, self.tolerance, self.loaded.name, self.findings, margin=margin,
                         extra_must=extra_must, output_margins=self.margins)


def build_plan(loaded, graph, findings, mode: str, tolerance, *, verify: bool = True, device: str = "auto",
               policy_file: Optional[str] = None, backend: str = "eager"):
    """Plan (or take the given policy), verify, refine: at most MAX_RUNS runs with a plan."""

    try:
        from preclint.plan.source_edit import source_diff  # lazy: libcst only where a source file is parsed
    except ImportError:  # libcst missing (a serving machine): the plan without the source diff
        source_diff = None

    margins = ()
    if tolerance.max_flip is not None and not any(n.record(DecisionMargins) is not None for n in graph.nodes):
        margins = output_margins(loaded.module, Inputs(tuple(loaded.args), dict(loaded.kwargs)))
    basis = PlanBasis(loaded, graph, findings, mode, tolerance, margins)
    plan = basis.make()
    floor = next((n for n in plan.notes if n.startswith("float32 itself")), None)
    if floor is not None and policy_file is None:
        raise UserError(floor)
    if policy_file is not None:
        _take_policy(plan, policy_file, loaded.module, graph)
    if verify:
        plan = verify_plan(plan, basis, device, fixed=policy_file is not None, backend=backend)
    plan.onnx_exclude = onnx_exclude_patterns(plan)
    plan.source_diff = source_diff(plan, graph, loaded.source_path) if source_diff is not None else None
    return plan


def _take_policy(plan, policy_file: str, module, graph) -> None:
    """The plan's keep list from a policy file, checked against the model."""

    try:
        policy = load_policy(policy_file)
    except PolicyError as exc:
        raise UserError(str(exc)) from None
    if policy.precision != plan.precision:
        raise UserError(f"the policy {policy_file} is for {policy.precision}, not --precision {plan.precision}")
    try:
        apply_policy(copy_to(module, None), policy)  # names every module and parameter it keeps?
    except PolicyError as exc:
        raise UserError(f"{policy_file}: {exc}") from None
    planner = Planner(graph, MODES[plan.precision], plan.tolerance)
    units = [Unit(k.module, k.op) for k in policy.keep]
    before = planner.predict(set())
    after = planner.predict(set(units))
    plan.keep = [KeepEntry(u.module, u.op, f"from {policy_file}", planner.unit_share(before.contributions, u),
                           planner.cost([u])) for u in units]
    plan.kept_flops_fraction = planner.cost(units)
    plan.predicted["after"] = planner.summary(after)
    plan.meets_tolerance = planner.meets(after)


def verify_plan(plan, basis: PlanBasis, device: str = "auto", *, fixed: bool = False, backend: str = "eager"):
    """The plan measured on ``device``, and refined where the measurement fails it (unless ``fixed``:
    a policy the user gave): the plan that was run last."""

    loaded, tolerance = basis.loaded, basis.tolerance
    try:
        verifier = Verifier(loaded.module, Inputs(tuple(loaded.args), dict(loaded.kwargs)), basis.mode, tolerance, device)
        if verifier.noise_floor is not None:
            _noise_floor(plan, verifier, loaded.name)
        before = verifier.run(None)
    except UserError:
        raise
    except Exception as exc:
        plan.notes.append(f"not verified: the model did not run for the measurement ({one_line(exc)})")
        return plan
    if before.meets and not fixed:
        # the run without a plan meets the tolerance already: nothing needs keeping, and no run is
        # spent verifying what the prediction kept as a surplus
        if plan.keep:
            plan.notes.append(f"the run without a plan meets the tolerance: nothing is kept (the prediction "
                              f"alone would have kept {len(plan.keep)} unit(s))")
        plan.keep, plan.kept_flops_fraction = [], 0.0
        plan.predicted["after"] = plan.predicted["before"]
        plan.measured = {"before": before.summary, "after": before.summary, "float32": verifier.float32.summary,
                         "how": verifier.how, "runs": 0}
        plan.meets_tolerance = True
        if backend != "eager":
            verify_compiled(plan, verifier, basis.graph, backend)
        return plan
    margin, extra = 1.0, []
    after = None
    for attempt in range(MAX_RUNS):
        after = verifier.run(plan.policy())
        if after.meets or fixed or attempt == MAX_RUNS - 1:
            break
        # refine: keep the module the run first went inf/NaN in, and demand more of the prediction by
        # as much as it fell short of the measurement
        if after.first_nonfinite is not None:
            extra.append(Unit(after.first_nonfinite))
        predicted = plan.predicted["after"].rel_error
        measured = after.summary.rel_error
        ratio = measured / predicted if measured and predicted and math.isfinite(measured / predicted) else 2.0
        margin *= max(ratio, 2.0)
        refined = basis.make(margin=margin, extra_must=extra)
        if refined.policy() == plan.policy():  # nothing more the error model can offer: no run is spent on it
            plan.notes.append(f"the measured error was {ratio:.2g}x the predicted, and no further layer is predicted to help")
            break
        refined.notes = plan.notes + [f"refined after run {attempt + 1}: the measured error was {ratio:.2g}x the predicted"]
        plan = refined
    while after.meets and not fixed and verifier.runs - 1 < MAX_RUNS:
        pruned, after, margin = _prune(plan, after, verifier, basis, margin, extra)
        if pruned is plan:
            break
        plan = pruned
    plan.measured = {"before": before.summary, "after": after.summary, "float32": verifier.float32.summary,
                     "how": verifier.how, "runs": verifier.runs - 1}
    for label, run in (("without the plan", before), ("with the plan", after)):
        if run.error:
            plan.notes.append(f"the run {label} failed: {run.error}")
    if not verifier.float32.meets:
        plan.notes.append("float32 itself misses the tolerance against float64 in this measurement: no plan can meet it")
    plan.meets_tolerance = after.meets
    if backend != "eager":
        verify_compiled(plan, verifier, basis.graph, backend)
    return plan


def _noise_floor(plan, verifier, name: str) -> None:
    """A model that does not give the same output twice (probe/noise.py): a tolerance its own noise
    misses ends the plan in one line (no plan can meet it, and runs spent on one would only measure
    the noise); one the noise meets is noted, since every measurement includes the noise."""

    floor, noise = verifier.noise_floor, verifier.noise.summary
    differ = f"differ by relative RMS {sci(floor)}" if math.isfinite(floor) else "differ in shape or in integer outputs"
    if not verifier.noise.meets:
        missed = []
        if noise.failing_fraction:
            missed.append(f"fail it on {percent(noise.failing_fraction)} of the elements")
        if noise.flip_fraction:
            missed.append(f"flip {percent(noise.flip_fraction)} of the decisions")
        raise UserError(f"no plan can meet {_tolerance_text(plan.tolerance)}: {name} is not deterministic (two float64 runs "
                        f"on the same inputs {differ}{', and ' + ' and '.join(missed) if missed else ''}); loosen the "
                        "tolerance above that noise, or make the forward deterministic (dropout off, noise from a seeded generator)")
    plan.notes.append(f"{name} is not deterministic: two float64 runs on the same inputs {differ}, within the tolerance; "
                      "every measurement below includes that noise")


def _prune(plan, after, verifier, basis: PlanBasis, margin: float, extra):
    """A plan that met with error to spare, made cheaper: the error model, calibrated by the
    measurement (the measured error over the predicted), chooses again, and a cheaper plan it finds
    is run. It replaces the plan only if it meets the tolerance too. Returns the plan, its run and
    the calibrated margin (the plan given back unchanged: nothing cheaper to try, or it missed)."""
    predicted, measured = plan.predicted["after"].rel_error, after.summary.rel_error
    if not plan.keep or not predicted or measured is None or not math.isfinite(measured) \
            or measured >= predicted * margin:
        return plan, after, margin
    calibrated = measured / predicted  # the margin that makes this plan's prediction its measurement
    cheaper = basis.make(margin=calibrated, extra_must=extra)
    if cheaper.kept_flops_fraction >= plan.kept_flops_fraction or cheaper.policy() == plan.policy() \
            or not cheaper.meets_tolerance:
        return plan, after, margin
    tried = verifier.run(cheaper.policy())
    if not tried.meets:
        plan.notes.append(f"a cheaper plan (the error model calibrated by the measured error, {calibrated:.2g}x the "
                          f"predicted) was run and missed the tolerance: the plan above is kept")
        return plan, after, margin
    cheaper.notes = plan.notes + [f"made cheaper after run {verifier.runs - 2}: the measured error was {calibrated:.2g}x "
                                  f"the predicted; the cheaper plan was run and meets the tolerance"]
    return cheaper, tried, calibrated


def render_console(plan, color: bool) -> str:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def say(text: str) -> None:  # the names in it (the model, its modules) as text, never as markup
        console.print(Text(visible(text)))

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=120, highlight=False)
    say(f"plan for {plan.model} under {plan.precision} ({_tolerance_text(plan.tolerance)})")
    if plan.keep:
        table = Table(show_edge=False)
        for column in ("module", "op", "reason", "share", "FLOPs"):
            table.add_column(column)
        for k in plan.keep:
            cells = [k.module or "<root>", k.op or "", k.reason, percent(k.share) if k.share is not None else "",
                     percent(k.flops_fraction)]
            cells = [Text(visible(cell)) for cell in cells]
            if k.alternative:
                cells[2].append(f"\n  faster fix: {visible(k.alternative)}")
            table.add_row(*cells)
        console.print(table)
    else:
        say("nothing to keep in float32: the whole model meets the tolerance in " + plan.precision)
    say(f"kept in float32: {percent(plan.kept_flops_fraction)} of the FLOPs")
    rows = [("predicted", plan.predicted)] + ([("measured", plan.measured)] if plan.measured else [])
    for label, figures in rows:
        parts = []
        for when in ("before", "after", "float32"):
            s = figures.get(when)
            if s is None:
                continue
            shown = f"rel {sci(s.rel_error)}, max abs {sci(s.max_abs_error)}" if s.finite else "inf/NaN"
            if s.failing_fraction is not None and s.finite:
                shown += f", failing {percent(s.failing_fraction)}"
            if s.flip_fraction is not None:
                shown += f", flips {percent(s.flip_fraction)}"
            parts.append(f"{when}: {shown}")
        extra = f" ({plan.measured['how']}, {plan.measured['runs']} run(s) with a plan)" if label == "measured" else ""
        say(f"{label}{extra}: " + "; ".join(parts))
    compiled = (plan.measured or {}).get("compiled")
    if compiled is not None:
        shown = f"rel {sci(compiled.rel_error)}, max abs {sci(compiled.max_abs_error)}" if compiled.finite else "inf/NaN"
        say(f"measured compiled ({plan.measured['compiled_how']}): with the plan: {shown}")
    say("meets the tolerance: " + ("yes" if plan.meets_tolerance else "no"))
    for note in plan.notes:
        say(f"note: {note}")
    if plan.keep:
        console.print()
        say("modules: " + ", ".join(k.module + (f":{k.op}" if k.op else "") or "<root>" for k in plan.keep))
        say("ONNX nodes_to_exclude (regular expressions over exported node names):")
        for pattern in plan.onnx_exclude:
            say(f"  {pattern}")
        say("apply at inference: from preclint.policy import load_policy, apply_policy; "
            "model = apply_policy(model, load_policy('plan.json'))")
    if plan.source_diff:
        console.print()
        say("the kept calls in your source:")
        console.print(Text(visible_text(plan.source_diff)))
    return log_lines(buffer.getvalue())
