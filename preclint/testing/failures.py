"""Why a test's comparison failed, for ``pytest --preclint`` (preclint.testing.pytest_plugin).

A failed test is explained when its AssertionError came from ``torch.testing.assert_close`` (read
from the traceback: however the function was imported or wrapped) or from an ``assert`` on a
``torch.allclose`` that answered False in the same statement. The explanation is the one
``preclint.testing.assert_close`` gives, against the test's own tolerance: the precision the
compared tensor was computed in, the error that precision puts on it, the layers that carry it,
whether the difference is that size (a precision difference) or larger (a real change), and the
tolerance that would pass.

The model: the one the test named with the ``preclint_model`` fixture, else the top-level module
whose call in the test returned the compared tensor (the same values). Nothing else is guessed: a
tensor no recorded call returned (post-processed, loaded) is left unexplained, with a line saying so.

The precision: ``--preclint=PRECISION`` (or the fixture's ``precision=``), else inferred from the
settings the model ran under (``infer_precision``).
"""
from __future__ import annotations

import ast
import functools
import linecache
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.testing._comparison as torch_comparison

from preclint.core.errors import UserError
from preclint.core.numerics import MODES
from preclint.core.tolerances import MARGIN
from preclint.load.modelio import Inputs, output_leaves
from preclint.testing import comparison as preclint_comparison
from preclint.testing.comparison import carrying_layers, difference
from preclint.testing.recording import RecordedCall, Recorder, Settings, settings_now
from preclint.testing.tolerances import as_inputs, tolerance
from preclint.testing.modes import not_deterministic_text, train_mode_effect

TORCH_ASSERT_CLOSE = torch_comparison.assert_close.__code__
PRECLINT_ASSERT_CLOSE = preclint_comparison.assert_close.__code__
CONVOLUTIONS = (torch.nn.modules.conv._ConvNd,)

# the first word of a summary line, by verdict
PRECISION, CHANGE, UNEXPLAINED = "precision", "real change", "not explained"
RANDOM = "not deterministic"  # dropout active: the compared runs are two random draws


@dataclass(frozen=True)
class FailedComparison:
    """A failed comparison: what was compared, with which tolerance (None: torch's default for the dtype)."""

    actual: Any
    expected: Any
    rtol: Optional[float]
    atol: Optional[float]
    how: str  # "torch.testing.assert_close", "torch.allclose"


@dataclass(frozen=True)
class Subject:
    """The model that computed the compared tensor, its inputs and the settings it ran under."""

    model: torch.nn.Module
    inputs: Inputs
    settings: Optional[Settings]
    precision: Optional[str]  # the test's own (preclint_model(..., precision=))
    computed: Optional[str] = None  # the precision preclint.testing.output_under computed the tensor in


@dataclass(frozen=True)
class Explanation:
    text: str  # appended to the AssertionError's message
    summary: str  # one line for the run's summary, starting with its verdict


def infer_precision(settings: Settings, model: torch.nn.Module) -> Tuple[str, str]:
    """(precision, why) the model computed in under ``settings``: autocast on for its device: fp16 or
    bf16; its parameters in float16/bfloat16: fp16-full/bf16-full; on a CUDA GPU that has TF32
    (Ampere and newer) with TF32 allowed for the ops it has (matmuls; cuDNN convolutions, allowed by default, where it has a convolution): tf32;
    else fp32, float32's own rounding (another kernel, device or order than the recording's)."""
    dtype = settings.autocast.get(settings.device)
    if dtype in ("float16", "bfloat16"):
        return ("fp16" if dtype == "float16" else "bf16"), f"autocast({settings.device!r}, {dtype}) was on"
    if settings.dtype in ("float16", "bfloat16"):
        return ("fp16-full" if settings.dtype == "float16" else "bf16-full"), f"its parameters are {settings.dtype}"
    if settings.device == "cuda" and settings.tf32_capable:
        if settings.matmul_tf32:
            return "tf32", "TF32 was allowed for CUDA matmuls"
        if settings.conv_tf32 and any(isinstance(m, CONVOLUTIONS) for m in model.modules()):
            return "tf32", "TF32 was allowed for cuDNN convolutions (torch's default)"
    return "fp32", f"float32 on {settings.device}, no TF32, no autocast: float32's own rounding"


def comparison_of(error: BaseException, recorder: Recorder) -> Optional[FailedComparison]:
    """The comparison that raised ``error``, or None where it is none this module reads (or one that
    preclint.testing.assert_close explained already)."""
    entries = []
    tb = error.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if any(entry.tb_frame.f_code is PRECLINT_ASSERT_CLOSE for entry in entries):
        return None
    for entry in reversed(entries):
        if entry.tb_frame.f_code is TORCH_ASSERT_CLOSE:
            local = entry.tb_frame.f_locals
            return FailedComparison(local.get("actual"), local.get("expected"), local.get("rtol"), local.get("atol"),
                              "torch.testing.assert_close")
    rejection = recorder.rejection
    if rejection is not None:
        for entry in entries:
            if entry.tb_frame is rejection.frame and _same_statement(rejection.frame.f_code.co_filename,
                                                                     entry.tb_lineno, rejection.line):
                return FailedComparison(rejection.actual, rejection.expected, rejection.rtol, rejection.atol, "torch.allclose")
    return None


def failed_values(error: BaseException, recorder: Recorder, most: int = 3) -> Tuple[Optional[FailedComparison], bool]:
    """(the comparison of float values that failed, whether it is an earlier one than ``error``'s).

    ``error``'s own comparison where it compared float values outside its tolerance; else the one
    whose AssertionError was being handled when ``error`` was raised: torchvision's model tests
    compare the scores first and, where that fails, the decisions (argmax, a detector's scores)
    inside the ``except``; a failure of those is explained by the values' failure before it. A
    failure that is not the values (a dtype, a device, a shape) is torch's to explain."""
    current: Optional[BaseException] = error
    for depth in range(most):
        if not isinstance(current, AssertionError):
            break
        found = comparison_of(current, recorder)
        if found is not None and _any_outside(found):
            return found, depth > 0
        if current.__suppress_context__:
            break
        current = current.__context__
    return None, False


def _same_statement(filename: str, raised: int, called: int) -> bool:
    """Whether line ``called`` is in the innermost statement of ``filename`` that holds line ``raised``."""
    if raised == called:
        return True
    inner = None
    for node in ast.walk(_parsed(filename) or ast.Module(body=[], type_ignores=[])):
        if isinstance(node, ast.stmt) and node.lineno <= raised <= (node.end_lineno or node.lineno):
            if inner is None or node.lineno >= inner.lineno and (node.end_lineno or 0) <= (inner.end_lineno or 0):
                inner = node
    return inner is not None and inner.lineno <= called <= (inner.end_lineno or inner.lineno)


@functools.lru_cache(maxsize=64)
def _parsed(filename: str) -> Optional[ast.Module]:
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _float_leaves(value: Any) -> List[torch.Tensor]:
    return [t for _, t in output_leaves(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def returned(call: RecordedCall, actual: Any) -> bool:
    """Whether ``actual`` (its first float tensor) is one of the call's outputs: the tensor itself or
    the same values (moved to the CPU, cast)."""
    compared = _float_leaves(actual)
    if not compared:
        return False
    a = compared[0].detach()
    for leaf in _float_leaves(call.output):
        if leaf is compared[0]:
            return True
        if tuple(leaf.shape) == tuple(a.shape) and torch.equal(leaf.detach().to("cpu", a.dtype), a.to("cpu")):
            return True
    return False


def subject_of(actual: Any, registered: List[Tuple[Any, Any, Optional[str]]],
               calls: List[RecordedCall]) -> Tuple[Optional[Subject], str]:
    """The model that computed ``actual``, or (None, why not)."""
    producing = [call for call in reversed(calls) if returned(call, actual)]  # the latest first
    settings = producing[0].settings if producing else None
    computed = producing[0].precision if producing else None
    if registered:
        candidates = registered
        if len(registered) > 1:
            candidates = [r for r in registered if any(call.module is r[0] for call in producing)]
            if len(candidates) != 1:
                return None, (f"{len(registered)} models were named with preclint_model and "
                              f"{'none' if not candidates else 'several'} of them returned the compared tensor")
        model, inputs, precision = candidates[0]
        if inputs is None:
            own = next((call for call in reversed(calls) if call.module is model), None)
            if own is None:
                return None, "the model named with preclint_model(model) was not called in the test: pass its inputs"
            inputs, settings = own.inputs, settings or own.settings
        return Subject(model, as_inputs(inputs), settings, precision, computed), ""
    modules = {id(call.module): call for call in producing}
    if len(modules) == 1:
        return Subject(producing[0].module, producing[0].inputs, settings, None, computed), ""
    if modules:
        return None, (f"{len(modules)} modules called in the test returned the compared tensor: "
                      "name the one under test with preclint_model(model, inputs)")
    return None, ("no module called in the test returned the compared tensor: "
                  "name the model with the preclint_model(model, inputs) fixture")


class Explainer:
    """Explains the failed comparisons of one run, ``precision`` "auto" or one of preclint's
    precisions, the tolerance predicted (``probe`` None) or measured on ``probe``."""

    def __init__(self, precision: str, probe: Optional[str] = None) -> None:
        self.precision = precision
        self.probe = probe

    def explain(self, error: BaseException, recorder: Recorder,
                registered: List[Tuple[Any, Any, Optional[str]]]) -> Optional[Explanation]:
        found, earlier = failed_values(error, recorder)
        if found is None:
            return None
        subject, why_not = subject_of(found.actual, registered, list(recorder.calls))
        if subject is None:
            explanation = Explanation(f"preclint: not explained: {why_not}.", f"{UNEXPLAINED}: {why_not}")
        else:
            try:
                explanation = self._explain(found, subject)
            except UserError as problem:
                explanation = Explanation(f"preclint: not explained: {problem}", f"{UNEXPLAINED}: {problem}")
        if earlier:
            return Explanation(f"preclint: the comparison of values that failed first, whose AssertionError the test "
                               f"handled before this one:\n{explanation.text}", explanation.summary)
        return explanation

    def precision_of(self, subject: Subject) -> Tuple[str, str]:
        if subject.precision is not None:
            return subject.precision, "given to preclint_model"
        if subject.computed is not None:  # known, where the run's precision is a blanket statement
            return subject.computed, "computed by preclint.testing.output_under"
        if self.precision != "auto":
            return self.precision, f"--preclint={self.precision}"
        settings = subject.settings or settings_now(subject.model, subject.inputs.args)
        precision, why = infer_precision(settings, subject.model)
        return precision, f"inferred: {why}"

    def _explain(self, found: FailedComparison, subject: Subject) -> Explanation:
        precision, why = self.precision_of(subject)
        if precision not in MODES:
            raise UserError(f"unknown precision {precision!r} (known: {', '.join(MODES)})")
        effect = train_mode_of(subject)
        if effect is not None and effect.random:
            return not_deterministic(precision, why, effect)
        tol = tolerance(subject.model, subject.inputs, precision, probe=self.probe, keep_mode=effect is not None)
        got, want = list(output_leaves(found.actual)), list(output_leaves(found.expected))
        if [p for p, _ in got] != [p for p, _ in want]:
            raise UserError("the compared values differ in structure; torch's message says how")
        names = {o.name for o in tol}
        parts, summaries = [], []
        for (path, a), (_, e) in zip(got, want):
            if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()):
                continue
            if tuple(a.shape) != tuple(e.shape):
                continue
            rtol, atol = self._test_tolerance(found, a, e)
            outside = _outside(a, e, rtol, atol)
            if not outside:
                continue
            output = tol[f"output{path}"] if f"output{path}" in names else tol.for_expected(e)
            text, summary = self._one(found, (a, e), output, tol, subject, precision=precision, why=why,
                                      test_tolerance=(rtol, atol), outside=outside, train_mode=effect)
            parts.append(text)
            summaries.append(summary)
        if not parts:
            raise UserError("no float tensor of the comparison is outside its tolerance; torch's message says what failed")
        verdict = CHANGE if any(s.startswith(CHANGE) for s in summaries) else PRECISION
        return Explanation("\n".join(parts), verdict + ": " + "; ".join(s.split(": ", 1)[1] for s in summaries))

    @staticmethod
    def _test_tolerance(found: FailedComparison, a: torch.Tensor, e: torch.Tensor) -> Tuple[float, float]:
        rtol, atol = found.rtol, found.atol
        if rtol is None or atol is None:  # torch's default for the dtypes compared
            rtol, atol = torch_comparison.default_tolerances(a, e)
        return float(rtol), float(atol)

    def _one(self, found: FailedComparison, pair, output, tol, subject: Subject, *, precision: str, why: str,
             test_tolerance: Tuple[float, float], outside: int, train_mode=None) -> Tuple[str, str]:
        a, e = pair
        rtol, atol = test_tolerance
        diff = difference(a, e, output)
        how = "measured" if output.measured else "predicted"
        lines = [f"preclint: {output.name} computed under {precision} ({why}); {found.how} with rtol={rtol:.2e}, "
                 f"atol={atol:.2e}: {outside} of {diff.numel} elements outside.",
                 f"  {precision} puts an error of RMS {output.sigma:.2e} on this output ({how}); the difference has "
                 f"RMS {diff.rms:.2e} ({diff.times_sigma:.3g}x that) and at most {diff.largest:.2e}."]
        if train_mode is not None:  # (the layers' ledger is the check's, of the model in eval mode)
            lines.append(f"  The model was called in train mode, and its batch statistics{train_mode.layers()} make "
                         "its output another than in eval mode: the error is measured in train mode.")
        else:
            layers = carrying_layers(tol, subject.model, subject.inputs, self.probe)
            if layers:
                lines.append(f"  The layers that carry {precision}'s error: "
                             + ", ".join(f"{name} ({share:.0%})" for name, share in layers) + ".")
        meetable = f"rtol={output.rtol:.2e}, atol={output.atol:.2e}"
        if diff.within_precision() and not diff.failing:
            lines.append(f"  Within what {precision} explains (at most {MARGIN:g}x its error): a precision difference, "
                         f"not a change. The tolerance {precision} can meet passes it: {meetable} "
                         f"(preclint.testing.tolerance(model, inputs, {precision!r}"
                         f"{', keep_mode=True' if train_mode is not None else ''}), {tol.source}).")
            summary = f"{PRECISION}: {output.name} under {precision}, {diff.times_sigma:.3g}x its error; {meetable} passes"
        elif diff.within_precision():
            lines.append(f"  Within what {precision} explains (at most {MARGIN:g}x its error): a precision difference, "
                         f"not a change. atol={diff.passing_atol:.2e} (rtol={output.rtol:.2e}) would pass.")
            summary = (f"{PRECISION}: {output.name} under {precision}, {diff.times_sigma:.3g}x its error; "
                       f"atol={diff.passing_atol:.2e} would pass")
        else:
            lines.append(f"  {diff.times_sigma:.3g}x the error {precision} explains, beyond the margin of {MARGIN:g}: "
                         f"a real change (weights, inputs, code), not rounding. The tolerance {precision} can meet "
                         f"({meetable}) fails it too; atol={diff.passing_atol:.2e} would pass, and would hide it.")
            summary = f"{CHANGE}: {output.name} under {precision}, {diff.times_sigma:.3g}x its error"
        return "\n".join(lines), summary


def train_mode_of(subject: Subject):
    """What the train mode the model was called in does to its output (testing.modes), or None where
    it was called in eval mode or its mode changes nothing."""

    if subject.settings is not None and not subject.settings.training:
        return None
    model = subject.model
    flags = [(m, m.training) for m in model.modules()]
    if subject.settings is not None and not any(mode for _, mode in flags):
        model.train()  # called in train mode, put in eval mode since: judged as it was called
    try:
        return train_mode_effect(model, subject.inputs)
    finally:
        for m, mode in flags:
            m.training = mode


def not_deterministic(precision: str, why: str, effect) -> Explanation:
    """A comparison of two random draws (dropout active): neither a precision difference nor a change."""

    return Explanation(not_deterministic_text(precision, why, effect),
                       f"{RANDOM}: output under {precision}, dropout active in train mode")


def _any_outside(found: FailedComparison) -> bool:
    """Whether a float tensor of the comparison has elements outside the test's own tolerance."""
    for (_, a), (_, e) in zip(output_leaves(found.actual), output_leaves(found.expected)):
        if (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()
                and tuple(a.shape) == tuple(e.shape) and _outside(a, e, *Explainer._test_tolerance(found, a, e))):
            return True
    return False


def _outside(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> int:
    """The elements of ``a`` outside ``atol + rtol |e|`` (NaN where the other is not: outside)."""
    a64 = a.detach().to("cpu", torch.float64)
    e64 = e.detach().to("cpu", torch.float64)
    return int((~torch.isclose(a64, e64, rtol=rtol, atol=atol)).sum())


def counts(summaries: List[str]) -> Dict[str, int]:
    """How many summary lines each verdict has."""
    found = {PRECISION: 0, CHANGE: 0, RANDOM: 0, UNEXPLAINED: 0}
    for line in summaries:
        for verdict in found:
            if line.startswith(verdict + ":"):
                found[verdict] += 1
    return found
