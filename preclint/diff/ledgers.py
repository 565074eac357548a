"""Two ledgers of one architecture side by side: per precision each model's output error, the ratio,
and the layers that account for the difference.

A layer's part of a model's squared relative output error is its share (its contribution, which the
probe measures and the error model predicts) times that error squared. The difference of the two
squared errors is the sum of the differences of the parts, so each layer's difference over the total
is the fraction of the gap it accounts for: these fractions sum to what the contributions explain.

At a layer's output the error is what the layer adds (local) and what it received and passed on,
amplified (independent errors add in quadrature): ``own`` is local^2 / received^2 in the model whose
part is the larger, the rest it inherited. The statistics beside each layer (value ranges, activation
outliers, folded batch-norm scales, decision margins, largest weights) are the reference pass's and
the checkpoint's own; the sentence at the top names the one whose ratio between the models is the
largest in the group of layers that accounts for most of the gap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preclint.core.findings import percent, sci

ALIKE = 1.1  # errors within this factor of each other are called alike
EXPLAINS = 1.5  # a statistic explains a gap where it differs between the models by this factor or more

# statistic -> (how the sentence names it, whether a larger value is the more fragile one)
STATISTICS = {
    "folded_scale": ("folded batch-norm scales", True),
    "activation_absmax": ("activations", True),
    "outlier_ratio": ("activation outliers (largest / RMS)", True),
    "weight_absmax": ("weights", True),
    "running_mean_absmax": ("batch-norm running means", True),
    "min_margin": ("decision margins", False),
}


@dataclass
class LayerRow:
    """One node's errors in one model under one precision (relative RMS; share of the output error)."""

    node: str
    module: str
    op: str
    kind: str
    location: Optional[Dict[str, Any]]
    local: Optional[float] = None
    received: Optional[float] = None
    share: Optional[float] = None
    amplification: Optional[float] = None


@dataclass
class Ledger:
    """One model's ledger under one precision: its output error and its rows in execution order."""

    mode: str
    output_error: Optional[float]
    rows: Dict[str, LayerRow]
    measured: bool
    error: Optional[str] = None  # why there is none
    # the output is inf/NaN (output_error is then inf: the largest error, not an unknown one); the first
    # node that overflows, where known
    overflow_at: Optional[str] = None

    @property
    def order(self) -> List[str]:
        return list(self.rows)


def ledger_of(report, mode: str, measured: bool) -> Ledger:
    """The ledger of ``report`` under ``mode``: the probe's (``measured``) or the predicted profile."""
    summary = report.summary.get(mode, {})
    if measured:
        entry = summary.get("measured_output", {})
        if "error" in entry:
            return Ledger(mode, None, {}, True, entry["error"])
        rows = {}
        for row in report.ledger or []:
            m = row["modes"].get(mode, {})
            if "error" in m:
                continue
            rows[row["node"]] = LayerRow(row["node"], row["module"], row["op"], row["kind"], row["location"],
                                         _rel(m.get("local")), _rel(m.get("received")), m.get("contribution"),
                                         m.get("amplification"))
        return Ledger(mode, math.inf if entry.get("finite") is False else entry.get("rel_error"), rows, True)
    rows = {}
    for row in report.profile or []:
        m = row["modes"].get(mode, {})
        rows[row["node"]] = LayerRow(row["node"], row["module"], row["op"], row["kind"], row["location"],
                                     m.get("local"), m.get("received"), m.get("share"))
    error = None if report.profile else "no predictions (the reference pass did not run)"
    predicted = summary.get("predicted_output", {})
    return Ledger(mode, math.inf if predicted.get("finite") is False else predicted.get("rel_error"), rows, False, error)


def _rel(figure) -> Optional[float]:
    return figure.get("rel_error") if isinstance(figure, dict) else None


@dataclass
class LayerDifference:
    """One layer in both models: its part of each one's squared output error, and the fraction of the gap."""

    node: str
    module: str
    op: str
    location: Optional[Dict[str, Any]]
    a: LayerRow
    b: LayerRow
    part_a: float
    part_b: float
    of_gap: float  # fraction of (E_worse^2 - E_better^2) this layer accounts for
    own: Optional[float]  # in the model whose part is larger: local^2 / received^2 at its output
    stats: Dict[str, Tuple[Optional[float], Optional[float]]] = field(default_factory=dict)

    def as_dict(self, labels: Tuple[str, str]) -> dict:
        a, b = labels
        return {"node": self.node, "module": self.module, "op": self.op, "location": self.location,
                "of_difference": _r(self.of_gap), "own": _r(self.own),
                "inherited": _r(None if self.own is None else 1.0 - self.own),
                a: _row_dict(self.a, self.part_a), b: _row_dict(self.b, self.part_b),
                "statistics": {k: {a: _r(x), b: _r(y)} for k, (x, y) in self.stats.items()}}


def _row_dict(row: LayerRow, part: float) -> dict:
    return {"local": _r(row.local), "received": _r(row.received), "share": _r(row.share),
            "amplification": _r(row.amplification), "part_of_squared_error": _r(part)}


def _r(value: Optional[float]) -> Optional[float]:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}") if value else 0.0


@dataclass
class ModeDifference:
    """Two ledgers under one precision, compared."""

    mode: str
    labels: Tuple[str, str]
    error_a: Optional[float]
    error_b: Optional[float]
    measured: bool
    layers: List[LayerDifference] = field(default_factory=list)  # largest fraction of the gap first
    groups: List[Tuple[str, float]] = field(default_factory=list)  # (module group, fraction of the gap)
    sentence: str = ""
    error: Optional[str] = None
    name_mode: bool = True  # the sentence names the precision ("B's fp16 error"); not where the sides are precisions
    overflow_at: Tuple[Optional[str], Optional[str]] = (None, None)  # each side's first overflowing node (display)

    @property
    def nonfinite(self) -> Tuple[bool, bool]:
        """Whether each side's output is inf/NaN under this precision."""
        return (self.error_a is not None and math.isinf(self.error_a),
                self.error_b is not None and math.isinf(self.error_b))

    @property
    def ratio(self) -> Optional[float]:
        if self.error_a is None or self.error_b is None or self.error_a <= 0 or all(self.nonfinite):
            return None
        return self.error_b / self.error_a

    @property
    def worse(self) -> Optional[int]:
        """0 where the first model's error is the larger, 1 for the second, None where unknown."""
        if self.error_a is None or self.error_b is None:
            return None
        return 1 if self.error_b >= self.error_a else 0

    def top(self, count: int) -> List[LayerDifference]:
        return self.layers[:count]

    def as_dict(self, count: int = 10) -> dict:
        a, b = self.labels
        return {"precision": self.mode, "measured": self.measured, "error": self.error,
                "output_error": {a: _r(self.error_a), b: _r(self.error_b)}, "ratio": _r(self.ratio),
                "output_finite": {a: not self.nonfinite[0], b: not self.nonfinite[1]},
                "overflows_at": {label: at for label, at in zip(self.labels, self.overflow_at) if at},
                "sentence": self.sentence, "groups": [{"group": g, "of_difference": _r(s)} for g, s in self.groups[:5]],
                "explained": _r(sum(layer.of_gap for layer in self.layers)),
                "layers": [layer.as_dict(self.labels) for layer in self.top(count)]}


def compare_ledgers(first: Ledger, second: Ledger, labels: Tuple[str, str],
                    stats: Optional[Dict[str, Dict[str, Tuple[Optional[float], Optional[float]]]]] = None) -> ModeDifference:
    """``first`` against ``second`` (one precision, one architecture); ``stats``: per node, each
    statistic's (first, second) value."""
    stats = stats or {}
    diff = ModeDifference(first.mode, labels, first.output_error, second.output_error, first.measured and second.measured)
    if first.error or second.error:
        diff.error = first.error or second.error
        diff.sentence = f"{first.mode}: not compared: {diff.error}"
        return diff
    ea, eb = first.output_error, second.output_error
    if (ea is None or eb is None) and not any(diff.nonfinite):
        diff.error = "an output error is not known"
        diff.sentence = f"{first.mode}: not compared: {diff.error}"
        return diff
    diff.overflow_at = (first.overflow_at, second.overflow_at)
    if any(diff.nonfinite):  # an infinite error is the largest: no gap to share out between the layers
        diff.sentence = sentence_of(diff)
        return diff
    worse = diff.worse
    gap = abs(eb * eb - ea * ea)
    for name, a in first.rows.items():
        b = second.rows.get(name)
        if b is None:
            continue
        part_a = (a.share or 0.0) * ea * ea
        part_b = (b.share or 0.0) * eb * eb
        grown = (part_b - part_a) if worse == 1 else (part_a - part_b)
        larger = b if part_b >= part_a else a
        own = None
        if larger.local is not None and larger.received:
            own = min(1.0, (larger.local / larger.received) ** 2)
        diff.layers.append(LayerDifference(name, a.module, a.op, a.location, a, b, part_a, part_b,
                                           grown / gap if gap > 0 else 0.0, own, stats.get(name, {})))
    diff.layers.sort(key=lambda layer: (-layer.of_gap, first.order.index(layer.node)))
    diff.groups = _groups(diff.layers)
    diff.sentence = sentence_of(diff)
    return diff


def group_depth(modules: List[str]) -> int:
    """The depth of module paths at which a model splits into three groups or more (``layer3`` in a
    ResNet, ``features.6`` in a VGG), at most 3."""
    for depth in (1, 2, 3):
        if len({".".join(m.split(".")[:depth]) for m in modules if m}) >= 3:
            return depth
    return 1


def _groups(layers: List[LayerDifference]) -> List[Tuple[str, float]]:
    depth = group_depth([layer.module for layer in layers])
    totals: Dict[str, float] = {}
    for layer in layers:
        key = ".".join(layer.module.split(".")[:depth]) if layer.module else "(top level)"
        totals[key] = totals.get(key, 0.0) + layer.of_gap
    return sorted(totals.items(), key=lambda item: -item[1])


def sentence_of(diff: ModeDifference) -> str:
    """The answer in one sentence: which error is larger and by how much, where the difference comes
    from, and the statistic that explains it."""
    a, b = diff.labels
    ea, eb = diff.error_a, diff.error_b
    mode = diff.mode if diff.name_mode else ""
    if any(diff.nonfinite):
        return _nonfinite_sentence(diff, mode)
    if ea == 0 and eb == 0:
        return f"{a}'s and {b}'s {mode} outputs are both exact".replace("  ", " ")
    worse, better = (b, a) if diff.worse == 1 else (a, b)
    high, low = (eb, ea) if diff.worse == 1 else (ea, eb)
    if low > 0 and high / low < ALIKE:
        return f"{a}'s and {b}'s {mode} errors are alike ({sci(ea)} and {sci(eb)})".replace("  ", " ")
    times = f"{high / low:.3g}x" if low > 0 else "infinitely larger than"
    text = f"{worse}'s {mode} error is {times} {better}'s ({sci(high)} vs {sci(low)})".replace("  ", " ")
    if not diff.groups or diff.groups[0][1] <= 0:
        return text
    group, fraction = diff.groups[0]
    text += f"; {percent(max(fraction, 0.0))} of the difference comes from {group}"
    reason = _reason(diff, group)
    return text + (f", where {reason}" if reason else "")


def _nonfinite_sentence(diff: ModeDifference, mode: str) -> str:
    """Which side's output is inf/NaN under the precision (its error the largest there is), and where
    it overflows first."""
    a, b = diff.labels
    where = [f" (it overflows first at {at})" if at else "" for at in diff.overflow_at]
    if all(diff.nonfinite):
        places = [f"{label} at {at}" for label, at in zip(diff.labels, diff.overflow_at) if at]
        text = f"Both {a}'s and {b}'s {mode} outputs are inf/NaN"
        return (text + (f" (first overflow: {', '.join(places)})" if places else "")).replace("  ", " ")
    bad, good = (0, 1) if diff.nonfinite[0] else (1, 0)
    error = (diff.error_a, diff.error_b)[good]
    known = sci(error) if error is not None else "not known"
    return (f"{diff.labels[bad]}'s {mode} output is inf/NaN{where[bad]}, where {diff.labels[good]}'s error is "
            f"{known}: {diff.labels[bad]} is the fragile one").replace("  ", " ")


# what the checkpoint holds (a cause) is named before what the run shows (its consequence)
_CAUSES = ("folded_scale", "weight_absmax", "running_mean_absmax")


def _reason(diff: ModeDifference, group: str) -> Optional[str]:
    """The statistics that differ most between the models in ``group``, as a clause (the largest
    ratio among the checkpoint's own figures, then among the run's), or None."""
    a, b = diff.labels
    worse_index = diff.worse or 0
    members = [layer for layer in diff.layers if layer.module == group or layer.module.startswith(group + ".")
               or group == "(top level)"]
    best: Dict[bool, tuple] = {}
    for key, (words, larger_is_worse) in STATISTICS.items():
        values = [layer.stats[key] for layer in members if key in layer.stats]
        pick = max if larger_is_worse else min
        first = [v[0] for v in values if v[0] is not None]
        second = [v[1] for v in values if v[1] is not None]
        if not first or not second:
            continue
        va, vb = pick(first), pick(second)
        worse_value, better_value = (vb, va) if worse_index == 1 else (va, vb)
        if worse_value <= 0 or better_value <= 0:
            continue
        ratio = worse_value / better_value if larger_is_worse else better_value / worse_value
        cause = key in _CAUSES
        if ratio >= EXPLAINS and (cause not in best or ratio > best[cause][0]):
            best[cause] = (ratio, words, worse_value, better_value, larger_is_worse)
    if not best:
        return None
    worse_label, better_label = (b, a) if worse_index == 1 else (a, b)
    clauses = []
    for cause in (True, False):
        if cause in best:
            _, words, worse_value, better_value, larger = best[cause]
            verb = "reach" if larger else "shrink to"
            clauses.append(f"{words} {verb} {sci(worse_value)} ({better_label}'s: {sci(better_value)})")
    return f"{worse_label}'s " + " and its ".join(clauses)
