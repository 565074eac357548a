"""The pytest plugin: ``pytest --preclint[=PRECISION]`` explains a test's failed
``torch.testing.assert_close`` (and ``assert torch.allclose(...)``) as preclint.testing.assert_close
does: the precision, the layers, a precision difference or a real change, and the tolerance that
would pass; and lists the explained failures at the end of the run (docs/testing.md).

Registered through the ``pytest11`` entry point, so pytest loads it in every suite where preclint is
installed: without ``--preclint`` it adds the option and the ``preclint_model`` fixture (a no-op)
and imports neither torch nor preclint's pipeline. With it, preclint.testing.failures does the work.

    pytest --preclint=tf32          # the precision the compared outputs were computed in
    pytest --preclint               # inferred from the settings each model ran under
    pytest --preclint=tf32 --preclint-probe=cuda   # the tolerance measured, not predicted

    def test_model(preclint_model):
        model, x = build()
        preclint_model(model, x)    # the model under test; without it, the module whose call returned the compared tensor
        torch.testing.assert_close(model(x), expected)
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Tuple

import pytest

AUTO = "auto"
PROBES = ("cpu", "cuda")
KEY = pytest.StashKey["Explaining"]()
REGISTERED = pytest.StashKey[List[Tuple[Any, Any, Optional[str]]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("preclint", "preclint: explain failed comparisons of model outputs")
    group.addoption("--preclint", nargs="?", const=AUTO, default=None, metavar="PRECISION", dest="preclint",
                    help="explain each failed torch.testing.assert_close / torch.allclose assert: the precision "
                         "(tf32, fp16, bf16, fp16-full, bf16-full, fp32...; without a value, inferred from the "
                         "settings the model ran under), the layers, precision or real change, and the tolerance "
                         "that would pass")
    group.addoption("--preclint-probe", choices=PROBES, default=None, dest="preclint_probe",
                    help="with --preclint: measure the tolerance on this device instead of predicting it")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: List[str]) -> None:
    """``--preclint tests/`` means --preclint=auto on tests/: a bare --preclint takes the next
    argument only where that is a precision (argparse would take a path as the value)."""
    if "--preclint" not in args:
        return
    from preclint.core.numerics import MODES  # lazy: importing the package or its pytest plugin loads no more of preclint

    for i, arg in enumerate(args[:-1]):
        if arg == "--preclint" and args[i + 1] not in MODES and args[i + 1] != AUTO:
            args[i] = f"--preclint={AUTO}"


def pytest_configure(config: pytest.Config) -> None:
    precision = config.getoption("preclint", None)
    if precision is None:
        return
    from preclint.core.numerics import MODES  # lazy: importing the package or its pytest plugin loads no more of preclint

    if precision != AUTO and precision not in MODES:
        raise pytest.UsageError(f"--preclint={precision}: unknown precision (known: {', '.join(MODES)})")
    explaining = Explaining(precision, config.getoption("preclint_probe", None))
    config.stash[KEY] = explaining
    config.pluginmanager.register(explaining, "preclint-explaining")


@pytest.fixture
def preclint_model(request: pytest.FixtureRequest):
    """``preclint_model(model, inputs=None, *, precision=None)``: names the model under test (and the
    inputs it was called on; None: those of its call in the test) for --preclint's explanations, and
    the precision its outputs were computed in where it is not the run's. Returns the model. Without
    --preclint it does nothing."""
    if KEY not in request.config.stash:
        return _unwatched
    registered = request.node.stash.setdefault(REGISTERED, [])

    def register(model, inputs=None, *, precision: Optional[str] = None):
        registered.append((model, inputs, precision))
        return model

    return register


def _unwatched(model, inputs=None, *, precision: Optional[str] = None):
    return model


class Explaining:
    """The hooks --preclint adds: watch each test's body, explain its failed comparison, sum up."""

    def __init__(self, precision: str, probe: Optional[str]) -> None:
        from preclint.testing.failures import Explainer  # lazy: importing the package or its pytest plugin loads no more of preclint

        self.explainer = Explainer(precision, probe)
        self.summaries: List[Tuple[str, str]] = []  # (test id, summary line)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        from preclint.testing.recording import Recorder  # lazy: importing the package or its pytest plugin loads no more of preclint

        recorder = Recorder()
        try:
            with recorder, warnings.catch_warnings():
                # torch warns that global module hooks fire once more for torch.compile's wrapper;
                # the recorder counts that call once, and a suite run with -W error must not fail on it
                warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
                outcome = yield
            error = outcome.excinfo[1] if outcome.excinfo else None
            if error is None and getattr(item, "_excinfo", None):  # a unittest.TestCase's failure, kept by pytest
                error = item._excinfo[0].value
            if isinstance(error, AssertionError):
                self._explain(item, error, recorder)
        finally:
            recorder.forget()
            item.stash.get(REGISTERED, []).clear()  # the models named: not kept past the test

    def _explain(self, item: pytest.Item, error: AssertionError, recorder) -> None:
        try:
            explanation = self.explainer.explain(error, recorder, item.stash.get(REGISTERED, []))
        except Exception as problem:  # an explanation must never replace the test's own failure
            text = f"preclint: could not explain this failure: {type(problem).__name__}: {problem}"
            explanation = None
            error.args = (f"{error}\n\n{text}",)
        if explanation is None:
            return
        error.args = (f"{error}\n\n{explanation.text}",)
        item.user_properties.append(("preclint", explanation.summary))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.failed:
            self.summaries += [(report.nodeid, value) for name, value in report.user_properties if name == "preclint"]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.summaries:
            return
        from preclint.testing.failures import counts  # lazy: importing the package or its pytest plugin loads no more of preclint

        terminalreporter.section("preclint", sep="=")
        for nodeid, line in self.summaries:
            terminalreporter.write_line(f"{nodeid}: {line}")
        found = counts([line for _, line in self.summaries])
        names = {"precision": "precision difference", "real change": "real change",
                 "not deterministic": "not deterministic comparison"}
        total = len(self.summaries)
        terminalreporter.write_line(
            ", ".join(f"{n} {names.get(verdict, verdict)}{'s' if n > 1 and verdict in names else ''}"
                      for verdict, n in found.items() if n) + f" ({total} failed comparison{'s' if total > 1 else ''})")
