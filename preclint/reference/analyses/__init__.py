"""Analyses: each computes one statistic of the graph's nodes and stores it as one typed record on
them (``node.put(Terms(...))``, read with ``node.record(Terms)``); the record type is declared in the
analysis's module, beside the code that writes it.

An analysis declares the record it writes and the records it reads (``needs``); the engine runs only
the analyses whose records the selected rules (``Rule.needs``), the predictions, the plan or the probe
read, each after those it depends on (``resolve``). Three kinds, by what they read:

- ForwardAnalysis: each node's operands and result as the reference pass runs it (``observe``);
- GradientAnalysis: the reference pass's backward passes (``watch``, ``listen``, ``finish``);
- WeightAnalysis: the model's weights alone, also under --no-run (``annotate``).

A new statistic is one new module here with its record and one Analysis subclass; nothing to
register (``python scripts/new_rule.py --statistic NAME SUMMARY`` writes one). The modules import
no torch at import time (the rules import their records, and importing the rule pack imports no
torch): the functions that compute import it.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, ClassVar, Iterable, List, Optional, Sequence, Tuple, Type

from preclint.capture.observer import Call


def direction_like(value, generator):
    """A standard normal direction of ``value``'s shape, dtype and device. Drawn on the CPU whatever the
    device (``generator`` is a CPU generator): the same directions, so the same gains, everywhere. A
    direction left on the CPU for a value on a GPU failed the analysis, silently, on every GPU check."""
    import torch

    return torch.randn(value.shape, generator=generator, dtype=value.dtype).to(value.device)


class Analysis:
    """One statistic: the record type it writes (``record``) and the record types it reads (``needs``)."""

    record: ClassVar[type]
    needs: ClassVar[Tuple[type, ...]] = ()
    reference_pass: ClassVar[bool] = True  # computed by the reference pass (so not under --no-run)
    gradients: ClassVar[bool] = False  # needs the reference pass's backward passes


class ForwardAnalysis(Analysis):
    def observe(self, node, call: "Call") -> None:
        """Record what ``call`` shows of ``node`` (no gradients are recorded meanwhile)."""
        raise NotImplementedError


class GradientListener:
    """What hears the gradients of a backward pass: the reference pass calls it from the gradient hooks,
    as the pass reaches each tensor it watches (once per direction the pass is run along)."""

    def on_grad(self, name: str, value, grad) -> None:
        """``grad``: the gradient of node ``name``'s value, ``value`` as the node made it."""

    def on_operand_grad(self, operand, value, grad) -> None:
        """``grad``: the gradient of ``operand``, one of the operands a node reads that the pass watches
        (``BackwardPasses.operands``), ``value`` its value as the node read it."""


class GradientAnalysis(Analysis, GradientListener):
    """A statistic of the backward passes. The reference pass runs the model and the passes, the analysis
    says what to watch and records what the gradients show (as torch.fx's ShapeProp: the interpreter
    runs, the pass records). The runner tracks every node's float value; beyond those, an analysis

    - ``watch``es operands of an op before it runs (the runner hands the op views of them, so that a
      hook sees the gradient flowing through that op alone);
    - ``listen``s to the pass from the model's outputs, which runs once for every analysis that does
      (its listener is often itself: ``on_grad``, ``on_operand_grad``);
    - in ``finish``, after the forward pass, runs passes of its own from other roots
      (``passes.run(roots, listeners)``) and writes its records.
    """

    gradients = True

    def watch(self, node, call: "Call") -> Sequence[Any]:
        """The operands of ``node`` whose gradients this analysis weighs: tensors among ``call.args`` and
        ``call.kwargs``, or weights the callee holds. The op has not run yet (``call.outputs`` is empty)."""
        return ()

    def listen(self, passes) -> Optional[GradientListener]:
        """What hears the pass from the model's outputs for this analysis (``passes``:
        reference.backward_passes.BackwardPasses), called once, before that pass runs; None where the
        analysis does not read it."""
        return None

    def finish(self, graph, passes) -> None:
        """Record what the backward passes show (``passes.main()``: the pass from the outputs, run the
        first time an analysis asks for it)."""
        raise NotImplementedError


class WeightAnalysis(Analysis):
    reference_pass = False

    def annotate(self, graph, module) -> None:
        """Record what the weights of ``module`` (the model ``graph`` was captured from) tell."""
        raise NotImplementedError


class DependencyError(Exception):
    """Analyses whose needs form a cycle, or a record no analysis writes."""


def analysis_modules() -> List[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


@functools.lru_cache(maxsize=None)
def every_analysis() -> Tuple[Type[Analysis], ...]:
    """Every analysis of the package, found by walking its modules."""
    found = []
    for name in analysis_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        found += [value for value in vars(module).values()
                  if isinstance(value, type) and issubclass(value, Analysis) and value.__module__ == module.__name__
                  and hasattr(value, "record")]
    return tuple(sorted(found, key=lambda a: a.__name__))


def rediscover() -> None:
    """Forget the analyses found, so that the next look walks the package again (after a module is added)."""
    importlib.invalidate_caches()
    every_analysis.cache_clear()


def writer_of(record: type, analyses: Iterable[Type[Analysis]] = ()) -> Type[Analysis]:
    """The analysis that writes ``record`` (among ``analyses``, else among every one)."""
    writers = [a for a in (tuple(analyses) or every_analysis()) if a.record is record]
    if len(writers) != 1:
        raise DependencyError(f"{len(writers)} analyses write {record.__name__}; one must")
    return writers[0]


def resolve(records: Iterable[type], analyses: Iterable[Type[Analysis]] = ()) -> List[Type[Analysis]]:
    """The analyses that write ``records`` and those they depend on, each after its dependencies
    (ties in the order of the records asked for, then of the needs declared)."""
    pool = tuple(analyses) or every_analysis()
    ordered: List[Type[Analysis]] = []
    visiting: List[type] = []

    def visit(record: type) -> None:
        analysis = writer_of(record, pool)
        if analysis in ordered:
            return
        if record in visiting:
            cycle = visiting[visiting.index(record):] + [record]
            raise DependencyError("analyses depend on each other: " + " -> ".join(r.__name__ for r in cycle))
        visiting.append(record)
        for need in analysis.needs:
            visit(need)
        visiting.pop()
        ordered.append(analysis)

    for record in records:
        visit(record)
    return ordered
