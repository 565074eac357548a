"""Each mode's passes in the probe: its sweep, the contributions from the sensitivity pass, its plain
run, the figures queued and read back (probe/__init__.py's ProbeSession runs the reference and
the sensitivity pass before them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from preclint.core.errors import one_line
from preclint.core.notes import Note
from preclint.measure.program import RunFailed
from preclint.probe.device import is_out_of_memory, release, tf32_on_gpu
from preclint.measure.compare import output_differences
from preclint.measure.runners import runner_for
from preclint.probe.ablate import ablate
from preclint.probe.ledger import ModeMeasure
from preclint.probe.readback import finish, queue_figures


@dataclass
class ModePasses:
    """What every mode's sweep and read-back share: the session (its setting and copies on the
    device), the reference, and the sensitivity pass (None when it failed)."""

    session: Any  # probe.ProbeSession
    ref: Any  # measure.ReferenceStore
    sens: Any  # measure.Sensitivity, or None
    shared: Any  # modes.SharedCopies: the maps between copies and the WeightStream

    def issue(self, mode: str):
        """Run the mode's sweep, backward pass and plain run and issue its figures; nothing is read
        back. Returns (measure, what ``finish`` needs, or None after a failure)."""
        import torch

        from preclint.probe.sweep import sweep  # lazy: looked up at each call, so that it can be replaced

        setting, copies, clock, sens = self.session.setting, self.session.copies, self.session.clock, self.sens
        device, graph = setting.device, setting.graph
        runner = runner_for(mode, device, setting.emulated)
        measure = ModeMeasure(mode, runner.how)
        swept = None
        try:
            with clock(f"{mode}: sweep"):
                run = runner.prepare(copies.model32, copies.inputs32, graph, self.shared)
                measure.how = run.how
                swept = sweep(copies.program, run, self.ref, graph, keep_errors=sens is not None)
            outputs = output_differences(swept.output, self.ref.output)
            present = outputs.present()
            contributions = ([], None)
            if sens is not None and present:
                # ||E|| stays on the device (no stall); finish() drops the contributions if it is 0 or inf
                norm = torch.sqrt(sum(torch.sum(e * e) for e in present))
                with clock(f"{mode}: contributions"), tf32_on_gpu(device, True):
                    contributions = self._contributions(mode, swept, outputs, norm)
            plain = None
            if not run.emulated:
                with clock(f"{mode}: plain run"):
                    plain = runner.run(run)
            with clock(f"{mode}: figures"):
                pending = queue_figures(swept, contributions, outputs, setting.tolerance, plain,
                                        ablate=setting.options.ablate and self.sens is not None)
            if self.shared.stream is not None and run.variant is not copies.model32:
                self.shared.stream.forget(run.variant)
            if not pending.ablate:
                swept.observer.errors = {}
            return measure, pending
        except Exception as exc:
            if swept is not None:
                swept.observer.errors = {}
            if sens is not None and out_of_memory(exc):
                # the run with gradients (its activations) and the error vectors a sweep keeps for
                # it are the probe's largest holdings after the reference: without them the mode's
                # own figures may fit (a 1B Llama at 4096 tokens on one H200)
                self._let_contributions_go(mode, device)
                return self.issue(mode)
            failed(measure, mode, device, exc)
            return measure, None

    def _contributions(self, mode: str, swept, outputs, norm):
        """The nodes' contributions from the run with gradients; ([], None) where its backward pass
        fails, as where the forward wrote in place into a value autograd saved (a recurrent state stored
        into its slot of a state tensor after a step read it): the mode's figures stand without them."""
        try:
            return self.sens.contributions(swept.observer.errors, outputs.errors, norm)
        except RuntimeError as exc:
            if out_of_memory(exc):
                raise
            self.sens.close()
            self.sens = None
            self.session.notes.append(Note("probe", f"contributions not measured from {mode} on: the backward pass of "
                                                    f"the run with gradients failed ({one_line(exc)})"))
            return [], None

    def _let_contributions_go(self, mode: str, device) -> None:
        self.sens.close()
        self.sens = None
        release(device)
        self.session.notes.append(Note(
            "probe", f"contributions not measured from {mode} on: out of memory on {device} with the run with "
            "gradients kept, so it was let go and the modes measured without it"))

    def finish(self, measure, pending) -> None:
        """Read the mode's figures back into ``measure`` (and run the ablation, if asked)."""

        session, swept = self.session, pending.swept
        graph, copies = session.setting.graph, session.copies
        try:
            with session.clock(f"{measure.mode}: read back"):
                finish(measure, pending, self.ref, graph)
            if pending.ablate:
                with session.clock(f"{measure.mode}: ablation"):
                    ablate(copies, graph, self.ref, pending, measure)
        except Exception as exc:
            failed(measure, measure.mode, session.setting.device, exc)
        finally:
            swept.observer.errors = {}


def out_of_memory(exc) -> bool:
    """Whether a pass failed for want of memory (the model's own exception, or the run's)."""
    return is_out_of_memory(exc.cause if isinstance(exc, RunFailed) else exc)


def failed(measure, mode, device, exc) -> None:
    """Put why the mode could not be measured on ``measure`` and give its memory back."""
    cause = exc.cause if isinstance(exc, RunFailed) else exc
    if is_out_of_memory(cause):
        measure.error = f"out of memory on {device}"
    elif isinstance(exc, RunFailed):
        measure.error = f"the model failed under {mode} on {device}: {one_line(cause)}"
    else:
        measure.error = f"{one_line(cause)}"
    release(device)
