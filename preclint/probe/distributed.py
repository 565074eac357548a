"""The probe on several GPUs (or hosts) under torch.distributed, started by torchrun:

    torchrun --nproc-per-node 2 -m preclint probe model.py --device cuda

Rank 0 runs the check (capture, the reference statistics, predictions, rules) while the other ranks
measure the precision modes, side by side: rank r >= 1 takes modes r - 1, r - 1 + (N - 1), ... of
the ones asked for, on its own GPU. The check and the probe need nothing of each other until the
verdicts, so they overlap: on one GPU a Llama-2-13B's check takes 40% of the time and its probe the
rest. A measuring rank takes the model's graph as the check would capture it, with no statistics (the
graph torch.fx traces, or the one its float64 reference run records) and measures a mode exactly as a
single process does; the measurements (a few kilobytes per node) are gathered to rank 0, which checks
that the ranks recorded its graph node for node, narrows what needed the check's statistics (which
decisions count flips, whether a product took TF32) and writes the one report: the ledger is the
single process's. A rank whose graph differs, or that failed, leaves its modes to rank 0, which
measures them as a single process would, with a note.

Only measurements cross between ranks, never activations or weights: several hosts work the same
way (torchrun --nnodes M --node-rank i --rdzv-endpoint HOST:PORT), over NCCL on GPUs and gloo on CPUs.

Who measures is a strategy the session (preclint.engine) picks when it starts (``strategy``): this
process alone (``OneProcess``), or under torchrun rank 0 (``Leader``) and the others (``Measurer``).
Per model it asks the strategy for that model's part (``model``), which measures, is told of a
failure, and is closed once the model is done, whatever happened.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from preclint.core.errors import one_line, UserError
from preclint.core.launch import launch_ranks, launched
from preclint.core.notes import Note
from preclint.probe import measure_model
from preclint.probe.readback import tf32_applied
from preclint.probe.sweep import counts_flips

if TYPE_CHECKING:
    from preclint.measure.compare import Tolerance


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def join(device_choice: str, timeout_s: float = 1800.0) -> Ranks:
    """Join the process group torchrun set up (NCCL where the probe runs on GPUs, gloo otherwise)
    and make this rank's GPU the current one. A rank that dies before the measurements are gathered
    leaves the others waiting ``timeout_s`` at most."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, world, local_rank = launch_ranks()  # (a UserError for an environment torchrun did not set whole)
    gpu = device_choice != "cpu" and torch.cuda.is_available()
    if gpu:
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"rank {rank} has local rank {local_rank}, but this host has "
                            f"{torch.cuda.device_count()} GPU(s): start at most that many processes per host")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=timeout_s or 1800.0))
        except (ValueError, RuntimeError) as exc:  # no MASTER_ADDR, a rendezvous that timed out or was refused
            raise UserError(f"rank {rank} of {world} could not join torchrun's process group: {one_line(exc)}; "
                            "start preclint with torchrun, or unset WORLD_SIZE to run it as one process") from None
    return Ranks(rank, world, local_rank)


def share(modes: Sequence[str], ranks: Ranks) -> Tuple[str, ...]:
    """The modes this rank measures: none on rank 0, which checks; the rest dealt out in turn."""
    if ranks.leader:
        return ()
    return tuple(modes[ranks.rank - 1::ranks.world - 1])


@dataclass
class Measured:
    """What a measuring rank sends rank 0 (``measure_share``): its result, and the graph it
    recorded to compare with the check's."""

    rank: int
    modes: Tuple[str, ...]
    result: Any = None  # ledger.ProbeResult
    capture: str = ""
    order: List[str] = field(default_factory=list)
    error: Optional[str] = None  # why this rank measured nothing


class Exchange:
    """The one gathering of every rank's part for one model: ``parts(mine)`` gathers (every rank
    calls it exactly once per model, ``close`` does so for a rank that failed before it could)."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.gathered: Optional[List[Optional[Measured]]] = None

    def parts(self, mine: Optional[Measured]) -> List[Optional[Measured]]:
        import torch.distributed as dist

        if self.gathered is None:
            parts: List[Optional[Measured]] = [None] * self.ranks.world
            dist.all_gather_object(parts, mine)
            self.gathered = parts
        return self.gathered

    def close(self) -> None:
        if self.gathered is None:
            self.parts(None)


def adopt(parts: Sequence[Optional[Measured]], graph, modes: Sequence[str]):
    """On rank 0: the measured modes of the parts that recorded ``graph`` (the check's) node for node,
    as a ledger.ProbeResult with what needed the check's statistics filled in from ``graph``; and the
    modes left to measure here, with why. (None, modes, reasons) when no part measured anything."""

    order = [n.name for n in graph.nodes]
    result, measured, reasons = None, {}, []
    for part in parts:
        if part is None or not part.modes:
            continue
        shown = ", ".join(part.modes)
        if part.result is None:
            reasons.append(f"rank {part.rank} could not measure {shown} ({part.error})")
            continue
        if part.capture != graph.capture or part.order != order:
            reasons.append(f"rank {part.rank} recorded another graph than the check's for {shown}")
            continue
        if result is None:
            result = part.result
        for mode, measure in part.result.modes.items():
            for name, m in measure.nodes.items():
                node = graph.get(name)
                if node is None:
                    continue
                if m.flips is not None and not counts_flips(node, graph):
                    m.flips = m.units = None
                if m.local_rms is not None:
                    m.tf32_applied = tf32_applied(node, m)
            measured[mode] = measure
        _merge_run_facts(result, part.result)
    if result is not None:
        result.modes = measured  # (combine puts them in order)
    missing = [mode for mode in modes if mode not in measured]
    return result, missing, reasons


def _merge_run_facts(into, other) -> None:
    """Timings (each stage's longest), notes (each once) and the noise floor of another rank's result."""
    if other is into:
        return
    for stage, seconds in other.timings.items():
        into.timings[stage] = max(into.timings.get(stage, 0.0), seconds)
    into.notes.extend(n for n in other.notes if n not in into.notes)
    if other.noise_floor is not None:  # the same model and inputs: the noisiest rank's floor holds for all
        into.noise_floor = max(into.noise_floor or 0.0, other.noise_floor)


def combine(adopted, local, modes: Sequence[str]):
    """``adopted`` (the other ranks' result, or None) with the modes rank 0 measured itself
    (``local``, or None), in the order of ``modes``."""
    if adopted is None:
        return local
    if local is not None:
        adopted.modes.update(local.modes)
        _merge_run_facts(adopted, local)
    adopted.modes = {mode: adopted.modes[mode] for mode in modes if mode in adopted.modes}
    adopted.environment["modes"] = {mode: m.how for mode, m in adopted.modes.items()}
    return adopted


def leave() -> None:
    """Leave the process group, every rank together: a measuring rank is done long before rank 0,
    which may still measure what a rank could not, and a rank tearing its connections down while
    another still holds its own aborted now and then (gloo, SIGABRT)."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def measure_share(module, inputs, modes: Sequence[str], options, ranks: Ranks,
                  tolerance: "Optional[Tolerance]" = None, *, name: str = "the model") -> Measured:
    """On a rank other than 0: its share of ``modes``, measured on the graph the probe records for
    itself, as a Measured for rank 0. A failure is sent, not raised: rank 0 waits for every rank's
    part, and measures these modes itself."""
    mine = share(modes, ranks)
    part = Measured(ranks.rank, mine)
    if not mine:
        return part
    try:
        # no graph: the probe takes the one torch.fx traces, or the one its float64 run records
        result = measure_model(module, inputs, None, mine, options, tolerance, name=name)
        part.capture, part.order = result.graph.capture, [n.name for n in result.graph.nodes]
        result.graph = None  # (rank 0 has the check's)
        part.result = result
    except Exception as exc:  # noqa: BLE001 - rank 0 measures these modes and says why
        part.result, part.error = None, one_line(exc)
    return part


class Measuring:
    """One model's measurements, taken in this process (``OneProcess``); the ranks' parts build on it."""

    def measure(self, module, inputs, graph, modes: Sequence[str], options,
                tolerance: "Optional[Tolerance]" = None, *, name: str = "the model"):
        """A ledger.ProbeResult of ``modes`` (None on a rank that sends its part to rank 0)."""
        return measure_model(module, inputs, graph, modes, options, tolerance, name=name)

    def failed(self, exc: BaseException) -> None:
        """The model could not be loaded, checked or measured here (the caller reports it, or not)."""

    def close(self) -> None:
        """The model is done with, whatever happened to it."""


class Strategy(abc.ABC):
    """Who measures the models of one session, and whether this process writes the report."""

    reports = True

    @abc.abstractmethod
    def model(self, modes: Sequence[str]) -> Measuring:
        """The part of one model's measurements (of ``modes``) this process takes."""

    def leave(self) -> None:
        """The session is over."""


class OneProcess(Strategy):
    """No torchrun: this process checks, measures every mode, and reports."""

    def model(self, modes: Sequence[str]) -> Measuring:
        return Measuring()


class _Ranked(Strategy):
    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def leave(self) -> None:
        leave()


class Leader(_Ranked):
    """Rank 0 under torchrun: checks each model and writes the report, with the other ranks'
    measurements; measures itself what they could not."""

    def model(self, modes: Sequence[str]) -> "Gathering":
        return Gathering(Exchange(self.ranks))


class Measurer(_Ranked):
    """A rank other than 0: measures its share of each model's modes and sends it to rank 0, which
    reports (any failure too); it writes no report."""

    reports = False

    def model(self, modes: Sequence[str]) -> "Sending":
        return Sending(Exchange(self.ranks), tuple(modes))


class _Exchanging(Measuring):
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def close(self) -> None:  # every rank gathers once per model, also where the model failed
        self.exchange.close()


class Gathering(_Exchanging):
    """On rank 0, one model: the other ranks' measurements, and the modes they could not measure."""

    def measure(self, module, inputs, graph, modes: Sequence[str], options,
                tolerance: "Optional[Tolerance]" = None, *, name: str = "the model"):
        adopted, missing, reasons = adopt(self.exchange.parts(None), graph, modes)
        local = None
        if missing:
            local = measure_model(module, inputs, graph, missing, options, tolerance, name=name)
        result = combine(adopted, local, modes)
        result.notes.extend(Note("probe", f"{reason}: measured by rank 0") for reason in reasons)
        result.environment["ranks"] = self.exchange.ranks.world
        return result


class Sending(_Exchanging):
    """On a measuring rank, one model: its share of the modes, sent to rank 0; a failure is sent as
    a part that says why, and rank 0 measures those modes itself."""

    def __init__(self, exchange: Exchange, modes: Tuple[str, ...]) -> None:
        super().__init__(exchange)
        self.modes = modes

    def measure(self, module, inputs, graph, modes: Sequence[str], options,
                tolerance: "Optional[Tolerance]" = None, *, name: str = "the model"):
        self.exchange.parts(measure_share(module, inputs, modes, options, self.exchange.ranks, tolerance, name=name))
        return None

    def failed(self, exc: BaseException) -> None:
        if self.exchange.gathered is None:
            ranks = self.exchange.ranks
            self.exchange.parts(Measured(ranks.rank, share(self.modes, ranks), error=one_line(exc)))


def strategy(device_choice: str, timeout_s: Optional[float] = None) -> Strategy:
    """Who measures: this process, or under torchrun (``launched``) the rank this process is,
    joined to the others (``join``: the probe's ``device_choice`` picks NCCL or gloo)."""
    if not launched():
        return OneProcess()
    ranks = join(device_choice, timeout_s)
    return Leader(ranks) if ranks.leader else Measurer(ranks)


__all__ = ["Ranks", "launched", "join", "share", "Measured", "Exchange", "adopt", "combine", "leave", "measure_share",
           "Strategy", "OneProcess", "Leader", "Measurer", "Measuring", "Gathering", "Sending", "strategy"]
