"""`preclint diff`'s walk: two models (one architecture, two checkpoints or two files), or one model
under two settings, each checked by the session (preclint.engine.Session: load, check, probe), then
their ledgers compared (ledgers.py), their checkpoints read (weights.py) and their runs followed node
by node to where they part (parting.py).

    with_weights = DiffRequest(("net.py", "net.py"), weights=("a.pt", "b.pt"))
    result = run_diff(config, LoadOptions(), CheckOptions(modes=("fp16",)), with_weights, probe=None)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from preclint.core.errors import UserError
from preclint.core.numerics import MODES
from preclint.diff.ledgers import ModeDifference, compare_ledgers, ledger_of, sentence_of
from preclint.diff.weights import CheckpointFacts, checkpoint_facts, invalid_values
from preclint.engine import CheckOptions, LoadOptions, Session
from preclint.reference.analyses.margins import DecisionMargins
from preclint.capture.usercode import guard
from preclint.diff.parting import part, Setting
from preclint.measure.copies import copy_to
from preclint.probe.device import select_device

DEVICE_SETTINGS = ("cpu", "cuda")  # --against a device: the same precision there, on its own kernels
FLOAT32 = "fp32"


@dataclass(frozen=True)
class DiffRequest:
    """What to compare: two targets (paths; the same one twice with two checkpoints), their weights,
    or one target ``against`` a second setting (a precision, fp32, or a device)."""

    targets: Tuple[str, ...]
    weights: Tuple[Optional[str], ...] = (None, None)
    against: Optional[str] = None


@dataclass
class Side:
    """One model as the session checked it."""

    label: str
    report: Any  # report.Report
    loaded: Any  # load.loader.LoadedModel
    graph: Any  # core.ir.Graph
    facts: CheckpointFacts
    ctx: Any = None  # rules.base.RuleContext: the predictions, per node

    def overflow_at(self, mode: str) -> Optional[str]:
        """The first node (as the report names it) whose value is inf/NaN in the float32 reference, or
        that the prediction has overflow under ``mode``; None where none does."""
        ctx = self.ctx
        if ctx is None:
            return None
        first = self.graph.first_nonfinite
        if first is not None:
            return f"{ctx.display(first)}, already in float32"
        prediction = ctx.predictions.get(mode)
        if prediction is None:
            return None
        for node in self.graph.nodes:
            figures = prediction.nodes.get(node.name)
            if figures is not None and (figures.overflow or figures.pole):
                return ctx.display(node.name)
        return None

    def ledger(self, mode: str, measured: bool):
        found = ledger_of(self.report, mode, measured)
        if found.output_error is not None and math.isinf(found.output_error):
            found.overflow_at = self.overflow_at(mode)
        return found


@dataclass
class DiffResult:
    labels: Tuple[str, str]
    sides: List[Side]
    modes: List[ModeDifference]
    parting: Any = None  # parting.Parting
    against: Optional[str] = None
    measured: bool = False
    device: str = "cpu"
    notes: List[str] = field(default_factory=list)

    def fragile(self) -> List[str]:
        """What makes a side unfit to compare, one sentence each (said first, and exit code 1): weights
        no trained checkpoint holds (inf/NaN, a negative running variance), an output that is inf/NaN
        under a precision compared."""
        found = []
        for side in self.sides:
            if side.facts.invalid:
                shown = "; ".join(side.facts.invalid[:3]) + (f"; and {len(side.facts.invalid) - 3} more"
                                                            if len(side.facts.invalid) > 3 else "")
                found.append(f"{side.label}'s weights are not valid: {shown}. {side.label} is the fragile one")
        for diff in self.modes:
            for label, bad, at in zip(diff.labels, diff.nonfinite, diff.overflow_at):
                if bad:
                    where = f", first at {at}" if at else ""
                    what = f"{label}'s {diff.mode} output" if diff.name_mode else f"{label}'s output"
                    found.append(f"{what} is inf/NaN{where}")
        return found

    def module_of(self, name: str) -> str:
        node = self.sides[0].graph.get(name)
        return node.module_path if node is not None else ""


class _KeepingSession(Session):
    """The session, keeping what its walk built (the loaded model and its graph): the diff reads the
    reference pass's statistics and runs the model again."""

    kept: Optional[Tuple[Any, Any, Any]] = None

    def _check(self, loaded, placement):
        report, graph, ctx = super()._check(loaded, placement)
        self.kept = (loaded, graph, ctx)
        return report, graph, ctx


def check_request(request: DiffRequest) -> None:
    """Mistakes in what is to be compared, found before any model loads."""
    count = len(request.targets)
    if request.against is not None:
        if count != 1 or any(request.weights[1:]):
            raise UserError("--against compares one model under two settings: give one MODEL (and at most one --weights)")
        setting = request.against
        if setting not in MODES and setting not in DEVICE_SETTINGS and setting != FLOAT32:
            known = ", ".join(list(MODES) + [FLOAT32] + list(DEVICE_SETTINGS))
            raise UserError(f"unknown --against setting {setting!r} (known: {known})")
        return
    if count == 1:
        given = [w for w in request.weights if w]
        if len(given) != 2:
            raise UserError("diff compares two checkpoints: give --weights A.pt --weights B.pt (or two MODEL files, "
                            "or --against SETTING)")
    elif count == 2:
        if len([w for w in request.weights if w]) == 1:
            raise UserError("with two MODEL files give --weights twice (one for each) or not at all")
    else:
        raise UserError(f"diff compares two models: give one MODEL with two --weights, or two MODEL files (got {count})")
    for weights in request.weights:
        if weights and not os.path.isfile(weights):
            raise UserError(f"{weights}: no such checkpoint file")


def labels_of(request: DiffRequest) -> Tuple[str, str]:
    """Short names for the two sides: the checkpoints' file names, or the models'."""
    names = [w for w in request.weights if w] if len(request.targets) == 1 else list(request.targets)
    stems = [os.path.splitext(os.path.basename(n.split(":")[0]))[0] or n for n in names]
    if len(stems) == 2 and stems[0] != stems[1]:
        return stems[0], stems[1]
    return "A", "B"


def run_diff(config, load: LoadOptions, check: CheckOptions, request: DiffRequest, probe=None) -> DiffResult:
    """Check both sides with the session and compare them."""
    check_request(request)
    if request.against is not None:
        return _against(config, load, check, request, probe)
    labels = labels_of(request)
    targets = request.targets if len(request.targets) == 2 else request.targets * 2
    sides = [_side(config, replace(load, weights=w or load.weights), check, target, label, probe)
             for target, w, label in zip(targets, request.weights, labels)]
    same_architecture(sides)
    measured = probe is not None
    modes = [compare_ledgers(sides[0].ledger(mode, measured), sides[1].ledger(mode, measured), labels, _statistics(sides))
             for mode in check.modes]
    result = DiffResult(labels, sides, modes, measured=measured, device=_device(probe))

    mode = check.modes[0]
    result.parting = _parting(config, sides[0], Setting(labels[0], None, mode), Setting(labels[1], None, mode),
                              sides[1].loaded.module, result)
    return result


def _against(config, load, check: CheckOptions, request: DiffRequest, probe) -> DiffResult:
    first = check.modes[0]
    setting = request.against
    modes = tuple(dict.fromkeys((first, setting))) if setting in MODES else (first,)
    if setting == first:
        raise UserError(f"--against {setting} is the --precision itself: name another setting")
    if setting == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--against cuda runs the precision on a GPU, and torch sees none here")
    side = _side(config, replace(load, weights=request.weights[0] or load.weights), replace(check, modes=modes),
                 request.targets[0], os.path.basename(request.targets[0]), probe)
    measured = probe is not None
    labels = (first, setting if setting in MODES or setting == FLOAT32 else f"{first} on {setting}")
    compared = []
    if setting in MODES:
        diff = compare_ledgers(side.ledger(first, measured), side.ledger(setting, measured), labels, None)
        diff.mode = f"{first} against {setting}"
        diff.name_mode = False
        diff.sentence = sentence_of(diff)
        compared.append(diff)
    result = DiffResult(labels, [side], compared, against=setting, measured=measured, device=_device(probe))
    if setting in DEVICE_SETTINGS:
        second = Setting(labels[1], None, first, device=setting, emulated=False)
    else:
        second = Setting(labels[1], None, None if setting == FLOAT32 else setting)
    result.parting = _parting(config, side, Setting(labels[0], None, first), second, side.loaded.module, result)
    return result


def _device(probe) -> str:
    if probe is None:
        return "cpu"

    return str(select_device(probe.device))


def _side(config, load: LoadOptions, check: CheckOptions, target: str, label: str, probe) -> Side:
    session = _KeepingSession(config, load=load, check=check,
                              probe=None if probe is None else replace(probe, ledger=True))
    try:
        with session:
            report = session.check(target)
    except UserError as exc:
        raise UserError(_blamed(session, label, str(exc))) from None
    if session.kept is None:
        raise UserError(f"{target}: the check kept no model to compare")
    loaded, graph, ctx = session.kept
    if report.error is not None:
        raise UserError(_blamed(session, label, report.error))
    return Side(label, report, loaded, graph, checkpoint_facts(loaded.module), ctx)


def _blamed(session: _KeepingSession, label: str, message: str) -> str:
    """``message`` (why a side's check ended), after what is wrong with its weights where something is:
    a run that cannot go on (the probe's float64 reference of NaN weights) still names the checkpoint."""

    invalid = invalid_values(session.kept[0].module) if session.kept is not None else []
    if not invalid:
        return message
    return f"{label}'s weights are not valid ({'; '.join(invalid[:3])}): {label} is the fragile one; {message}"


def same_architecture(sides: List[Side]) -> None:
    """Raise where the two models are not one architecture: their parameters, or the ops they run."""
    a, b = sides
    shapes = [{k: tuple(v.shape) for k, v in s.loaded.module.state_dict().items()} for s in sides]
    if shapes[0] != shapes[1]:
        only = sorted(set(shapes[0]) ^ set(shapes[1]))
        other = next((k for k in shapes[0] if k in shapes[1] and shapes[0][k] != shapes[1][k]), None)
        what = (f"{only[0]} is in one of them only" if only else
                f"{other} has shape {shapes[0][other]} in {a.label} and {shapes[1][other]} in {b.label}")
        raise UserError(f"{a.label} and {b.label} are not one architecture: {what}")
    ops_a = [(n.name, n.fn) for n in a.graph.nodes]
    ops_b = [(n.name, n.fn) for n in b.graph.nodes]
    if ops_a != ops_b:
        at = next((i for i, (x, y) in enumerate(zip(ops_a, ops_b)) if x != y), min(len(ops_a), len(ops_b)))
        where = ops_a[at][0] if at < len(ops_a) else ops_b[at][0]
        raise UserError(f"{a.label} and {b.label} are not one architecture: their ops differ from node {where} on")


def _statistics(sides: List[Side]) -> Dict[str, Dict[str, Tuple[Optional[float], Optional[float]]]]:
    """Per node, each statistic the diff explains a layer by: (first model's, second's)."""
    per_side = [node_statistics(s) for s in sides]
    return {name: {k: (stats.get(k), per_side[1].get(name, {}).get(k)) for k in stats}
            for name, stats in per_side[0].items()}


def node_statistics(side: Side) -> Dict[str, Dict[str, float]]:
    found: Dict[str, Dict[str, float]] = {}
    for node in side.graph.nodes:
        stats: Dict[str, float] = {}
        out = node.out
        if out is not None and out.dtype.startswith(("float", "bfloat")) and out.numel and out.rms > 0:
            stats["activation_absmax"] = out.absmax
            stats["outlier_ratio"] = out.absmax / out.rms
        margins = node.record(DecisionMargins)
        if margins is not None and margins.values:
            stats["min_margin"] = min(margins.values)
        weights = side.facts.modules.get(node.module_path) if node.target.startswith("nn.") else None
        if weights is not None:
            stats.update(weights.as_dict())
        if stats:
            found[node.name] = stats
    return found


def _parting(config, side: Side, first, second, second_module, result: DiffResult):
    """The two settings' runs on the first side's inputs, followed along its graph."""
    import torch

    device = torch.device(result.device)
    with guard(side.loaded.name, config.timeout):
        with torch.no_grad():
            model_one = copy_to(side.loaded.module, device)
            model_two = model_one if second_module is side.loaded.module else copy_to(second_module, device)
        second_device = torch.device(second.device) if second.device != "cpu" else device
        if second_device != device:
            with torch.no_grad():
                model_two = copy_to(second_module, second_device)
        first = replace(first, model=model_one, device=device)
        second = replace(second, model=model_two, device=second_device)
        return part(first, second, side.loaded.inputs, side.graph)
