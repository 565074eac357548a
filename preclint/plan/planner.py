"""The mixed-precision plan: the fewest float32 FLOPs that bring a precision mode under a tolerance.

From the error model's per-node shares of the output error (predict/error_model.py) the plan chooses
units to keep in float32, where a unit is a leaf module (``layer1.0.conv1``) or one op of a module's own
forward (``exp`` in ``block``), and, for a cast model (``-full``), what is not a module: the
model's inputs (``<inputs>``: not cast down on entry), its outputs (``<outputs>``: not cast back)
and a parameter the format cannot hold (``<param:layer1.0.bn1.running_var>``). Those three cost no
FLOPs; their share is what the predicted output error loses when they are kept.

1. what must be kept: values that overflow the format, values that underflow to 0 and then feed a
   division, rsqrt or log, constants the format cannot hold; where keeping a value moves the
   overflow on (a float32 result too large for the next float16 layer), that layer is kept too.
2. then, while the predicted output error fails the tolerance (or a decision flips more often than
   the budget allows), the unit with the largest share of what fails per FLOP it costs in float32;
   afterwards every chosen unit the tolerance can do without is dropped again, dearest first, so
   the set is not a prefix of any ranking.

Every candidate set is judged by predicting the whole mode again with those nodes in float32
(``predict_mode(float32=...)``), so what a kept layer changes downstream (a float32 residual stream,
an overflow moved to the next conv) is in the figure. ``plan/verify.py`` measures the result.
"""
from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from preclint.core.findings import ErrorFigure
from preclint.core.ir import Graph, Kind, Node
from preclint.reference.analyses.decision_gains import DecisionGains
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins
from preclint.core.numerics import FP32, MODES, Mode
from preclint.core.tolerances import failing_fraction, passing_atol
from preclint.predict.error_model import ModePrediction, expected_flip_fraction, propagated_error, predict_mode
from preclint.predict.local import rounding_terms
from preclint.predict.range import reaching_absmax
from preclint.measure.compare import Tolerance
from preclint.plan.conditional import conditional_units
from preclint.plan.document import KeepEntry, Plan
from preclint.plan.units import (INPUTS_UNIT, NO_ARITHMETIC, OUTPUTS_UNIT, Unit, is_model_tensor, module_within, node_flops,
                                 parent, promotes, unit_nodes, unit_of)
from preclint.core.errors import UserError
from preclint.load.modelio import output_tensors

PLAN_MODES = ("fp16", "bf16", "fp16-full", "bf16-full")


def _keepable(planner: "Planner", node: Node) -> bool:
    """An input or a model tensor that a cast model can take in float32 by itself."""
    formats = {name: p.fmt for name, p in planner.predict(set()).nodes.items()}
    if node.kind == Kind.INPUT:
        return promotes(planner.graph, node, modules_cast=True, formats=formats)
    return is_model_tensor(node) and promotes(planner.graph, node, formats=formats)


class Planner:
    """Predictions of ``mode`` on ``graph`` with a set of units in float32."""

    def __init__(self, graph: Graph, mode: Mode, tolerance: Tolerance, output_margins: Sequence[float] = ()) -> None:
        self.graph = graph
        # top-1 minus top-2 of each row of a classifier's scores: the output itself is the decision
        # where the graph holds none (the argmax happens after the model)
        self.output_margins = list(output_margins)
        self.mode = mode
        self.tolerance = tolerance
        self.margin = 1.0  # the predicted error is multiplied by this before the comparison (refinement)
        self.flops = {n.name: node_flops(n) for n in graph.nodes}
        self.total_flops = sum(self.flops.values()) or 1.0
        self._nodes: Dict[Unit, Tuple[str, ...]] = {}
        self._cache: Dict[FrozenSet[Unit], ModePrediction] = {}
        self._conditional: Optional[Dict[Unit, FrozenSet[str]]] = None
        # a rounding to integers decides as much as an argmax: both flip under a low precision
        self.decisions = [n for n in graph.nodes
                          if n.record(DecisionMargins) is not None or n.record(RoundingMargins) is not None]

    @property
    def conditional(self) -> Dict[Unit, FrozenSet[str]]:
        """A cast model's inputs and parameters that it can take in float32 only while the ops reading
        them, which take their operands' dtypes as given (a functional conv's weight), run in float32
        too: unit -> those readers (plan/conditional.py)."""
        if self._conditional is None:
            self._conditional = conditional_units(self.graph, self.mode)
        return self._conditional

    def runnable(self, units) -> bool:
        """Whether every conditional unit among ``units`` has its readers kept too."""
        kept = None
        for unit in units:
            readers = self.conditional.get(unit)
            if readers is not None:
                kept = self.kept_nodes(units) if kept is None else kept
                if not readers <= kept:
                    return False
        return True

    def runnable_part(self, units) -> Set[Unit]:
        """``units`` without the conditional ones whose readers are no longer kept."""
        kept = self.kept_nodes(units)
        return {u for u in units if u not in self.conditional or self.conditional[u] <= kept}

    def nodes(self, unit: Unit) -> Tuple[str, ...]:
        if unit not in self._nodes:
            self._nodes[unit] = tuple(unit_nodes(self.graph, unit))
        return self._nodes[unit]

    def kept_nodes(self, units) -> Set[str]:
        return {n for u in units for n in self.nodes(u)}

    def cost(self, units) -> float:
        return sum(self.flops[n] for n in self.kept_nodes(units)) / self.total_flops

    def predict(self, units) -> ModePrediction:
        key = frozenset(units)
        if key not in self._cache:
            kept = self.kept_nodes(key)
            rounded = self._rounded_inputs(key)
            prediction = predict_mode(self.graph, self.mode, float32=frozenset(kept) | rounded,
                                      cast_back=self._cast_back(key, kept) | rounded)
            self._cache[key] = prediction
        return self._cache[key]

    def _rounded_inputs(self, units) -> FrozenSet[str]:
        """A cast model's inputs are rounded to the low format on entry (the error model leaves that
        rounding to the caller: predict/local.py's exact_result); the plan counts it, in the output error and in
        every decision downstream, since keeping ``<inputs>`` is how it is undone."""
        if self.mode.autocast or INPUTS_UNIT in units:
            return frozenset()
        return frozenset(n.name for n in self.graph.nodes
                         if n.kind == Kind.INPUT and n.out is not None and n.out.is_float and n.out.finite)

    @property
    def returned(self) -> FrozenSet[str]:
        return frozenset(n for out in self.graph.output_nodes for n in out.inputs)

    def _cast_back(self, units, kept: Set[str]) -> FrozenSet[str]:
        """-full modes: float32 results the model returns (kept, or promoted by a kept input), which
        apply_policy casts back to the low dtype (a layer of the cast model that reads a kept result
        casts it itself: node_format's parameters)."""
        return frozenset() if self.mode.autocast or OUTPUTS_UNIT in units else self.returned

    # ------------------------------------------------------------------ judging a prediction

    def flip_budget(self, node: Node) -> float:
        if self.tolerance.max_flip is not None:
            return self.tolerance.max_flip
        margins = node.record(DecisionMargins) or node.record(RoundingMargins)
        units = margins.units if margins is not None else 1  # every decision, not only those sampled
        return 0.5 / units  # no budget given: fewer than one decision expected to change

    def judges_decisions(self) -> bool:
        """Decisions count where the user gave a budget, or where the output has no float values."""
        return self.tolerance.max_flip is not None or not self.tolerance.compares_values

    def failing_fraction(self, p: ModePrediction) -> Optional[float]:

        if not self.tolerance.compares_values or p.output_error is None or not p.output_numel:
            return None
        return failing_fraction(p.output_error * self.margin, p.output_rms, self.tolerance.rtol or 0.0,
                                self.tolerance.atol or 0.0)

    def values_fail(self, p: ModePrediction) -> bool:
        fraction = self.failing_fraction(p)
        return fraction is not None and fraction * p.output_numel >= 0.5

    def flipping(self, p: ModePrediction) -> List[Node]:
        if not self.judges_decisions():
            return []
        return [d for d in self.decisions
                if (p.nodes[d.name].flip_fraction or 0.0) * self.margin > self.flip_budget(d)]

    def output_flips(self, p: ModePrediction) -> Optional[float]:
        """Expected fraction of the output's top-1 decisions that change (classifier scores)."""
        if not self.output_margins or p.output_error is None:
            return None
        return expected_flip_fraction(self.output_margins, p.output_error * self.margin, False)

    def output_flipping(self, p: ModePrediction) -> bool:
        flips = self.output_flips(p)
        return self.tolerance.max_flip is not None and flips is not None and flips > self.tolerance.max_flip

    def meets(self, p: ModePrediction) -> bool:
        return p.finite and not self.values_fail(p) and not self.flipping(p) and not self.output_flipping(p)

    def summary(self, p: ModePrediction) -> ErrorFigure:
        flips = [p.nodes[d.name].flip_fraction for d in self.decisions if p.nodes[d.name].flip_fraction is not None]
        if self.output_flips(p) is not None:
            flips.append(self.output_flips(p))
        return ErrorFigure(p.rel_error, p.max_abs_error, max(flips) if flips else None, finite=p.finite,
                           failing_fraction=self.failing_fraction(p))

    # ------------------------------------------------------------------ shares

    def output_terms(self, p: ModePrediction) -> Dict[str, float]:
        return dict(p.contributions)

    def decision_terms(self, p: ModePrediction, decision: Node) -> Dict[str, float]:
        """Each node's share of the error a decision receives (its upstream gains), as fractions."""
        toward = decision.record(DecisionGains)
        gains = (toward.gap or toward.upstream) if toward is not None else {}
        terms = {}
        for name, gain in gains.items():
            node = self.graph.get(name)
            if node is None:
                continue
            term = propagated_error(node, rounding_terms(node, self.mode, p.nodes[name].fmt), gain)
            if term > 0:
                terms[name] = term
        total = sum(terms.values())
        return {n: t / total for n, t in terms.items()} if total > 0 else {}

    def unit_share(self, terms: Dict[str, float], unit: Unit) -> float:
        return sum(terms.get(n, 0.0) for n in self.nodes(unit))

    def marginal_share(self, kept: Set[Unit], unit: Unit) -> float:
        """The fraction of the predicted output error variance (or of a failing decision's flips) that
        keeping ``unit`` as well removes: the share of a unit that is no computation (inputs, outputs,
        a parameter)."""
        p, q = self.predict(kept), self.predict(set(kept) | {unit})
        if not q.finite:
            return 0.0
        if not p.finite:
            return 1.0
        share = 0.0
        if p.output_error is not None and q.output_error is not None and p.output_error > 0:
            share = 1.0 - (q.output_error / p.output_error) ** 2
        for decision in self.flipping(p):  # and what it takes off the flips of a decision that fails
            before, after = p.nodes[decision.name].flip_fraction or 0.0, q.nodes[decision.name].flip_fraction or 0.0
            if before > 0:
                share = max(share, 1.0 - after / before)
        return max(0.0, share)


# ---------------------------------------------------------------------------------------- planning


def must_keep(planner: Planner, kept: Set[Unit], reasons: Dict[Unit, str]) -> None:
    """Add to ``kept`` what the format cannot hold, until the prediction is finite (or nothing helps)."""
    graph, mode = planner.graph, planner.mode
    low = mode.low.name
    for _ in range(len(graph.nodes) + 1):
        p = planner.predict(kept)
        bad = [n for n in graph.nodes if p.nodes[n.name].overflow or p.nodes[n.name].pole]
        if not bad:
            return
        added = False
        for node in bad:
            if node.kind == Kind.OUTPUT:
                continue
            if not mode.autocast and node.name in planner.returned and OUTPUTS_UNIT not in kept \
                    and reaching_absmax(node) > mode.low.max_finite:
                # a cast model casts its outputs back to the low format: return them as computed
                kept.add(OUTPUTS_UNIT)
                reasons.setdefault(OUTPUTS_UNIT, f"overflow: an output (|x| up to {reaching_absmax(node):.3g}) "
                                                 f"does not fit {low}: returned in float32")
                added = True
                break
            unit = unit_of(node, mode) if node.kind != Kind.INPUT and not is_model_tensor(node) \
                or _keepable(planner, node) else unit_of(node)
            why = _must_reason(node, p, low)
            source = _flushed_source(planner, kept, node) if p.nodes[node.name].pole and not mode.autocast else None
            if source is not None:  # the value that flushes to 0 is an input or a parameter: keep it, not the layer
                unit, why = source, f"underflow: its values become 0 in {low}, and a division, rsqrt or log reads them"
            # a unit already kept still overflows where its result goes back to the low format: widen it
            while unit is not None and unit in kept:
                unit = parent(unit)
            if unit is None or node.kind == Kind.INPUT and mode.autocast:
                continue
            kept.difference_update({u for u in kept if u.op is not None and module_within(u.module, unit.module)
                                    or u.op is None and unit.op is None and u.module != unit.module
                                    and module_within(u.module, unit.module)})
            kept.add(unit)
            reasons.setdefault(unit, why)
            added = True
            break  # predict again: keeping one value in range often brings the next ones back too
        if not added:
            return


def _flushed_source(planner: Planner, kept: Set[Unit], pole: Node, depth: int = 6) -> Optional[Unit]:
    """The input or parameter upstream of ``pole`` whose smallest values flush to 0 in the low format,
    where keeping it alone in float32 removes the pole (a running variance of 1e-9 read by rsqrt)."""
    graph, low = planner.graph, planner.mode.low
    seen, frontier, sources = set(), list(pole.inputs), []
    for _ in range(depth):
        following = []
        for name in frontier:
            node = graph.get(name)
            if node is None or name in seen:
                continue
            seen.add(name)
            out = node.out
            if _keepable(planner, node) and out is not None and out.is_float \
                    and out.finite and 0 < out.absmin_nonzero < low.min_subnormal / 2:
                sources.append(unit_of(node, planner.mode))
            following += list(node.inputs)
        frontier = following
    for unit in sources:
        if unit not in kept and not planner.predict(set(kept) | {unit}).nodes[pole.name].pole:
            return unit
    return None


def _must_reason(node: Node, p: ModePrediction, low: str) -> str:
    if p.nodes[node.name].pole:
        return f"underflow: a value that becomes 0 in {low} reaches a division, rsqrt or log here"
    out = node.out
    if node.scalars and any(abs(v) > 0 and math.isfinite(v) and abs(v) > 65504 for v in node.scalars.values()):
        return f"constant: a constant of this op does not fit in {low}"
    limit = MODES[low].low.max_finite
    if out is not None and out.is_float and reaching_absmax(node) <= limit:
        inputs = [n for n in (planner_inputs(node, p)) if n is not None]
        if inputs:
            return f"overflow: a float32 input (|x| up to {max(inputs):.3g}) does not fit {low} where this layer reads it"
    size = f" (|x| up to {reaching_absmax(node):.3g})" if out is not None and out.is_float else ""
    return f"overflow: its values leave {low}'s range{size}"


def planner_inputs(node: Node, p: ModePrediction) -> List[float]:
    """The magnitudes of the node's inputs, from the reference statistics."""
    return [s.absmax for s in node.input_stats if s is not None and s.is_float and s.finite]


def choose(planner: Planner, must: Set[Unit]) -> Set[Unit]:
    """Add units by share of what fails per unit of cost until the prediction meets the tolerance,
    then drop every added one the tolerance can do without, dearest first."""
    kept = set(must)
    candidates = _candidates(planner)
    for _ in range(len(candidates) + 1):
        p = planner.predict(kept)
        if planner.meets(p) or not p.finite:
            break
        shares: List[Dict[str, float]] = []
        if planner.values_fail(p) or planner.output_flipping(p):
            shares.append(planner.output_terms(p))
        shares += [planner.decision_terms(p, d) for d in planner.flipping(p)]
        best, best_score = None, 0.0
        for unit in candidates:
            if unit in kept or any(u.op is None and module_within(unit.module, u.module) for u in kept):
                continue
            if not planner.runnable(kept | {unit}):
                continue
            if unit.is_module:
                share = max((planner.unit_share(s, unit) for s in shares), default=0.0)
            else:
                share = planner.marginal_share(kept, unit)
            if share <= 0:
                continue
            score = share / max(planner.cost([unit]), 1e-12)
            if score > best_score:
                best, best_score = unit, score
        if best is None:
            break
        kept.add(best)
    if not planner.meets(planner.predict(kept)):
        # an op kept alone still reads the module's rounded parameters: keep its module instead
        widened = {parent(u) if u.op is not None else u for u in kept}
        if not planner.meets(planner.predict(widened)):
            return kept
        kept = widened
    for unit in sorted(kept - must, key=lambda u: (-planner.cost([u]), u.label)):
        if unit not in kept:
            continue
        trial = planner.runnable_part(kept - {unit})
        if planner.meets(planner.predict(trial)) and must <= trial:
            kept = trial
    return kept


def _candidates(planner: Planner) -> List[Unit]:
    units = []
    cast_model = not planner.mode.autocast
    for node in planner.graph.nodes:
        if node.out is None or not node.out.is_float:
            continue
        if cast_model and (_keepable(planner, node) or unit_of(node, planner.mode) in planner.conditional):
            units.append(unit_of(node, planner.mode))  # the low format rounds it, or cannot hold it
        if node.kind in NO_ARITHMETIC:
            continue
        units.append(unit_of(node))
    if cast_model:
        units.append(OUTPUTS_UNIT)
    return sorted(dict.fromkeys(units), key=lambda u: u.label)


def output_margins(module, inputs) -> List[float]:
    """Top-1 minus top-2 per row of the model's float outputs that look like class scores (the last
    dimension holds more than one score), from one float32 forward pass; at most 4096 rows."""
    import torch

    with torch.no_grad():
        outputs = output_tensors(inputs.call(module))
    margins: List[float] = []
    for t in outputs:
        if t.is_floating_point() and t.dim() >= 2 and t.shape[-1] > 1:
            top = t.detach().float().reshape(-1, t.shape[-1]).topk(2, dim=-1).values
            margins += (top[:, 0] - top[:, 1]).tolist()
    return margins[:: max(1, len(margins) // 4096)]


def float32_floor(graph: Graph, mode: Mode) -> Optional[ModePrediction]:
    """The error float32 itself has against float64: every rounding of the cast model, at float32's
    unit roundoff (the error model is linear in u)."""
    full = predict_mode(graph, MODES[f"{mode.low.name}-full"])
    if full.output_error is None:
        return None
    scale = FP32.unit_roundoff / mode.low.unit_roundoff
    floor = ModePrediction(full.mode, output_rms=full.output_rms, output_numel=full.output_numel,
                           output_error=full.output_error * scale, finite=True)
    return floor


def make_plan(graph: Graph, mode_name: str, tolerance: Tolerance, model: str, findings: Sequence[Any] = (), *,
              margin: float = 1.0, extra_must: Sequence[Unit] = (), output_margins: Sequence[float] = ()) -> Plan:
    """The plan for ``mode_name`` from the error model (no run of the model)."""

    if mode_name not in PLAN_MODES:
        raise UserError(f"plan chooses layers for a reduced precision: --precision one of {', '.join(PLAN_MODES)}, "
                        f"not {mode_name!r}")
    if not graph.ran_reference:
        raise UserError("plan predicts from the reference pass that --no-run skips")
    mode = MODES[mode_name]
    planner = Planner(graph, mode, tolerance, output_margins)
    planner.margin = margin
    plan = Plan(model, mode_name, tolerance)
    if tolerance.compares_values:
        floor = float32_floor(graph, mode)
        if floor is not None and planner.values_fail(floor):
            plan.notes.append(_floor_note(floor, tolerance, planner))
    reasons: Dict[Unit, str] = {}
    must: Set[Unit] = set(extra_must)
    for unit in extra_must:
        reasons[unit] = "refinement: the verification run went inf/NaN here"
    must_keep(planner, must, reasons)
    everything = {Unit("")} | (set() if mode.autocast else {INPUTS_UNIT, OUTPUTS_UNIT})
    if planner.meets(planner.predict(everything)):
        kept = choose(planner, must)
    else:  # not even the whole model in float32 meets it
        kept = set(must)
        plan.notes.append("no plan is predicted to meet the tolerance: even the whole model in float32 misses it; "
                          "only what must be kept is kept")
    before, after = planner.predict(set()), planner.predict(kept)
    plan.predicted = {"before": planner.summary(before), "after": planner.summary(after)}
    plan.meets_tolerance = planner.meets(after) and not any(n.startswith("float32 itself") for n in plan.notes)
    terms = before.contributions
    alternatives = _alternatives(graph, findings, mode_name)
    for unit in sorted(kept, key=lambda u: (-planner.unit_share(terms, u), u.label)):
        share = planner.unit_share(terms, unit) if terms else None
        reason = reasons.get(unit) or _share_reason(planner, unit, before)
        alternative = next((alternatives[n] for n in planner.nodes(unit) if n in alternatives), None)
        plan.keep.append(KeepEntry(unit.module, unit.op, reason, share, planner.cost([unit]), alternative))
    plan.kept_flops_fraction = planner.cost(kept)
    inputs = sum(share for name, share in after.contributions.items() if graph[name].kind == Kind.INPUT)
    if not plan.meets_tolerance and inputs > 0.5:
        plan.notes.append(f"{inputs:.0%} of the remaining error is the rounding of the model's inputs to {mode.low.name}, "
                          "which no layer kept in float32 undoes: feed float32 inputs (apply_policy casts them where a "
                          "float16 layer reads them)")
    if not after.finite:
        plan.notes.append(f"the plan could not keep every value in {mode.low.name}'s range: keeping more in float32 "
                          "does not help where the model's inputs or outputs themselves leave it (a cast model returns "
                          f"{mode.low.name})")
    return plan


def _share_reason(planner: Planner, unit: Unit, before: ModePrediction) -> str:
    if planner.output_flipping(before) or planner.flipping(before):
        return "decisions: its rounding flips decisions"
    return "accuracy: a large share of the output error for its cost"


def _floor_note(floor: ModePrediction, tolerance: Tolerance, planner: Planner) -> str:

    honest = passing_atol(floor.output_error, floor.output_numel)
    return (f"float32 itself is predicted to miss rtol={tolerance.rtol}, atol={tolerance.atol} against float64 "
            f"(max abs error about {floor.max_abs_error:.2g}): no plan can meet it; atol >= {honest:.2g} can be met")


def _alternatives(graph: Graph, findings: Sequence[Any], mode: str) -> Dict[str, str]:
    """node -> a rule's fix for the value it must keep (a rescaling, an epsilon the format holds)."""
    out: Dict[str, str] = {}
    for f in findings:
        node = getattr(f, "node", None)
        if node and f.severity != "info" and (not f.precisions or mode in f.precisions) and f.fix:
            out.setdefault(node, f"{f.code}: {f.fix.strip().splitlines()[0]}")
    return out
