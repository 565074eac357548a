"""Fuzzing preclint (benchmarks/fuzz): a fixed, seeded sample of generated model files through
``preclint check`` and mutated Python files through ``--source-only``, ``--fix`` and ``--diff``, each
judged by the fuzz oracle (no traceback, internal error, signal, hang or invalid document; a mistake
is one line and exit 2; a fix never breaks a file that compiled nor touches one it was not asked to).
The oracle itself is tested on planted failures, and each failure the long run found is reproduced
here as a user met it.

The same cases run every time. ``PRECLINT_FUZZ_N=K`` runs K times as many (new seeds after the fixed
ones); ``python -m benchmarks.fuzz --models 10000 --sources 10000`` is the long run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks.fuzz import cases
from benchmarks.fuzz.minimize import minimize_text
from benchmarks.fuzz.oracle import Run, judge, run_in_child, run_in_process
from tests import paths

ROOT = str(paths.ROOT)
SCALE = max(1, int(os.environ.get("PRECLINT_FUZZ_N", "1")))
MODELS = 6 * SCALE
SOURCES = 60 * SCALE
SOURCE_BATCH = 30


def _failure(name: str, checked) -> str:
    v = checked.verdict
    run = checked.run
    tail = f"\nexit {run.rc}\nstderr: {run.stderr[-2000:]}\nstdout: {run.stdout[-1000:]}" if run else ""
    return f"{name}: {v.failure}: {v.detail}\n(rebuild it with benchmarks.fuzz.cases.build({name!r})){tail}"


# ------------------------------------------------------------------ the seeded sample


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(MODELS))
def test_generated_model(seed, tmp_path):
    name = f"model-{seed}"
    checked = cases.check(cases.build(name), str(tmp_path))
    assert checked.verdict.ok, _failure(name, checked)


@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, SOURCES, SOURCE_BATCH))
def test_mutated_sources(first, tmp_path, monkeypatch):
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    failures = []
    for seed in range(first, first + SOURCE_BATCH):
        name = f"source-{seed}"
        checked = cases.check(cases.build(name, "own"), str(tmp_path))
        if not checked.verdict.ok:
            failures.append(_failure(name, checked))
    assert not failures, "\n\n".join(failures)


def test_cases_are_reproducible():
    a, b = cases.build("model-11"), cases.build("model-11")
    assert (a.files, a.argv, a.tags) == (b.files, b.argv, b.tags)
    s, t = cases.build("source-7", "own"), cases.build("source-7", "own")
    assert (s.data, s.argv, s.mode) == (t.data, t.argv, t.mode)


# ------------------------------------------------------------------ the oracle on planted failures

def _model(tmp_path, forward: str, layer: str = "nn.Linear(4, 4)", inputs: str = "torch.randn(2, 4)") -> str:
    """Write m.py: a model ``Net`` with one layer ``self.fc`` and the given forward body (over ``x``)."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    (tmp_path / "m.py").write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        self.fc = {layer}\n\n"
        f"    def forward(self, x):\n{body}\n\n\nmodel = Net()\nexample_inputs = ({inputs},)\n")
    return str(tmp_path)


def test_the_oracle_passes_a_clean_run(tmp_path):
    argv = ["check", "m.py", "--output-format", "json"]
    run = run_in_process(argv, _model(tmp_path, "return self.fc(x)"))
    assert run.rc in (0, 1), run.stderr
    assert judge(run, argv, valid=True).ok


@pytest.mark.slow
def test_the_oracle_sees_a_process_killed_by_a_signal(tmp_path):
    argv = ["check", "m.py"]
    run = run_in_child(argv, _model(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"), timeout=120)
    verdict = judge(run, argv, valid=True)
    assert verdict.failure == "crash" and "SIGSEGV" in verdict.signature, verdict


@pytest.mark.slow
def test_the_oracle_sees_a_hang(tmp_path):
    argv = ["check", "m.py"]
    (tmp_path / "m.py").write_text("while True:\n    pass\n")
    run = run_in_child(argv, str(tmp_path), timeout=3)
    assert judge(run, argv, valid=True).failure == "hang"


def test_the_oracle_sees_an_internal_error_and_a_traceback():
    argv = ["check", "m.py"]
    internal = Run(2, "", "preclint: internal error: KeyError: 'x' (run with --debug for the traceback)\n", 0.1)
    assert judge(internal, argv, valid=True).failure == "crash"
    traceback = Run(1, "", 'Traceback (most recent call last):\n  File "/x/preclint/cli.py", line 1, in main\nValueError: y\n', 0.1)
    verdict = judge(traceback, argv, valid=True)
    assert verdict.failure == "crash" and "ValueError at cli.py:main" in verdict.signature
    assert judge(Run(3, "", "", 0.1), argv, valid=True).failure == "exit-status"


@pytest.mark.parametrize("fmt, stdout", [
    ("json", '{"findings": ['),  # cut short
    ("json", '{"findings": [], "x": NaN}'),  # not JSON, though Python's json reads it
    ("sarif", '{"version": "2.1.0", "runs": "none"}'),  # parses, fails the schema
    ("sarif", '{"version": "2.1.0", "runs": []}{"version": "2.1.0", "runs": []}'),  # two documents
    ("rdjson", '{"diagnostics": [{"message": "m", "location": {"path": "a.py", "range": {"start": {"line": 0}}}}]}'),
    ("github", "::error file=a.py,line=x::message\n"),
    ("gitlab", '[{"description": "d", "check_name": "PCL502", "severity": "major"}]'),  # no fingerprint, no location
    ("gitlab", '[' + ','.join(['{"description": "d", "check_name": "PCL502", "fingerprint": "f", "severity": "major", '
                               '"location": {"path": "a.py", "lines": {"begin": 1}}}'] * 2) + ']'),  # one fingerprint twice
    ("junit", '<testsuites><testsuite name="preclint"><testcase name="a.py"><failure message="m">'),  # cut short
    ("junit", '<testsuites><testcase name="a.py"/></testsuites>'),  # a test case outside any suite
])
def test_the_oracle_sees_an_invalid_document(fmt, stdout):
    argv = ["check", "m.py", "--output-format", fmt]
    assert judge(Run(1, stdout, "", 0.1), argv, valid=True).failure == "invalid-document"


@pytest.mark.slow
def test_the_oracle_sees_a_model_file_preclint_modified(tmp_path, monkeypatch):
    """A planted bug: the check writes into the model file it was given."""
    import preclint.cli

    original = preclint.cli.main

    def writes_back(argv):
        for name in argv:
            if name.split(":")[0].endswith(".py"):
                with open(name.split(":")[0], "a") as f:
                    f.write("# touched\n")
        return original(argv)

    monkeypatch.setattr(preclint.cli, "main", writes_back)
    case = cases.build("model-0")
    assert not case.process
    checked = cases.check(case, str(tmp_path))
    assert checked.verdict.failure == "modified-input", checked.verdict


def test_the_oracle_sees_a_user_error_with_a_traceback_or_a_silent_exit():
    argv = ["check", "m.py", "--input-shape", "x"]
    assert judge(Run(2, "", "", 0.1), argv, valid=False).failure == "user-error"
    two = Run(2, "", "preclint: error: bad shape\nsomething else\n", 0.1)
    assert judge(two, argv, valid=False).failure == "user-error"
    assert judge(Run(2, "", "preclint: error: bad shape\n", 0.1), argv, valid=False).ok


def test_the_minimizer_keeps_the_failure():
    text = "\n".join(f"a{i} = {i}" for i in range(40)) + "\nboom = 1\n" + "\n".join(f"b{i} = {i}" for i in range(40))
    small = minimize_text(text, lambda t: "boom" in t)
    assert "boom" in small and len(small) < 10


# ------------------------------------------------------------------ failures the long run found


def _preclint(args, cwd):
    return subprocess.run([sys.executable, "-m", "preclint", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_model_whose_output_holds_inf_or_nan_is_reported_not_crashed(tmp_path):
    """The check of a model whose float32 run makes inf or NaN ended in an internal error."""
    _model(tmp_path, """
        y = self.fc(x)
        dropped = torch.where(y > 0, torch.log(-y.abs() - 1), y)  # NaN where the where keeps y
        return y / 0.0, dropped
    """)
    result = _preclint(["check", "m.py", "--output-format", "json"], tmp_path)
    assert "internal error" not in result.stderr and result.returncode == 1, result.stderr
    codes = {f["code"] for f in json.loads(result.stdout)["findings"]}
    assert "PCL002" in codes  # the infinities reach the output


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_source_file_with_a_literal_python_cannot_evaluate_is_checked(tmp_path):
    """A 5,000-digit integer (beyond Python's int-to-str limit) ended a --source-only run in an
    internal error; libcst parses it, Python does not evaluate it."""
    (tmp_path / "t.py").write_text("import torch\nx = " + "9" * 5000 + "\ny = 1e" + "9" * 5000
                                   + "\ntorch.testing.assert_allclose(x, x, rtol=" + "1" * 5000 + ")\n")
    result = _preclint(["check", "--source-only", "t.py", "--output-format", "json"], tmp_path)
    assert result.returncode == 1 and "error" not in result.stderr, result.stderr
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == ["PCL503"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_submodule_that_never_called_module_init_is_one_line_and_exit_2(tmp_path):
    """A block whose __init__ forgets super().__init__() ended in an internal error (AttributeError:
    '_modules') while preclint looked for the model."""
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                self.scale = 2.0

            def forward(self, x):
                return x * self.scale

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()

            def forward(self, x):
                return self.block(x)

        example_inputs = (torch.randn(2, 4),)
    """))
    result = _preclint(["check", "m.py"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("preclint: error: m.py: Block was never initialised as an nn.Module "
                                     "(its __init__ does not call super().__init__())")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_weight_read_by_f_linear_under_tf32_is_ordinary_rounding_in_the_probe(tmp_path):
    """``--probe`` on F.linear(x, self.fc.weight) ended in an internal error (ZeroDivisionError): the
    weight, stored in float32, was taken to round nothing under TF32, though the matmul rounds it."""
    _model(tmp_path, "return F.linear(F.normalize(x, dim=-1), self.fc.weight)", "nn.Linear(8, 16)", "torch.randn(4, 8)")
    result = _preclint(["check", "m.py", "--probe", "cpu", "--output-format", "json"], tmp_path)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_fix_keeps_the_comments_above_an_import_it_removes(tmp_path):
    """--fix replaced @autocast(...) from torch.cuda.amp and removed the import, and with it the
    comment above the import."""
    (tmp_path / "t.py").write_text(textwrap.dedent("""\
        import torch


        # Ensure returned array dtype is correct for platform

        from torch.cuda.amp import autocast

        @autocast(enabled=False)
        def forward(x):
            return x


        # mixed precision for the tail
        from torch.cuda.amp import autocast as ac
    """))
    result = _preclint(["check", "--source-only", "--fix", "--unsafe-fixes", "t.py"], tmp_path)
    assert result.returncode in (0, 1), result.stderr
    text = (tmp_path / "t.py").read_text()
    assert "from torch.cuda.amp import autocast\n" not in text  # the fix was made
    assert "# Ensure returned array dtype is correct for platform\n\n@torch.autocast(" in text, text
    compile(text, "t.py", "exec")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_view_made_in_inference_mode_then_written_through_its_base_is_checked(tmp_path):
    """torch refuses to read the grad_fn of a view made in inference mode whose base the model then
    writes in place; the check ended in an internal error."""
    _model(tmp_path, """
        h = F.layer_norm(x, (4,))
        with torch.inference_mode():
            wide = h.expand(2, *h.shape)
        h.clamp_(-1, 1)
        return self.fc(wide), self.fc(h)
    """, inputs="torch.randn(3, 4)")
    result = _preclint(["check", "m.py", "--output-format", "json"], tmp_path)
    assert result.returncode in (0, 1) and not result.stderr, result.stderr
    assert json.loads(result.stdout)["capture"] == "function-mode"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_tensor_made_in_inference_mode_is_probed(tmp_path):
    """Tensors made in inference mode have no version counter: the probe's float64 pass read it to
    share copies and refused the model ("Inference tensors do not track version counter"; fuzz
    case model-8072)."""
    _model(tmp_path, """
        with torch.inference_mode():
            noise = torch.randn_like(x)
        return self.fc(x + noise / 65504.0)
    """)
    result = _preclint(["probe", "m.py", "--device", "cpu", "--precision", "fp16,bf16-full", "--capture", "function-mode",
                        "--output-format", "json"], tmp_path)
    assert result.returncode in (0, 1) and not result.stderr, result.stderr
    assert json.loads(result.stdout)["environment"]["reference"]["dtype"] == "float64", result.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_checked_files_syntax_warnings_are_not_printed(tmp_path):
    """Compiling a checked file printed its SyntaxWarnings (``1for``, ``"\\d"``) on preclint's stderr."""
    (tmp_path / "t.py").write_text('import torch\nx = [1for i in range(3)]\ny = "\\d"\ntorch.testing.assert_allclose(x, x)\n')
    result = _preclint(["check", "--source-only", "--no-cache", "t.py"], tmp_path)
    assert result.returncode == 1 and result.stderr == "", result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_name_with_a_zero_width_joiner_is_a_file_that_cannot_be_parsed(tmp_path):
    """libcst builds a Name node that refuses 'x\\u200d' (CSTValidationError), which ended the run in
    an internal error; CPython refuses the character too."""
    (tmp_path / "t.py").write_bytes("import torch\nx\u200d = 1\ntorch.testing.assert_allclose(1, 1)\n".encode())
    result = _preclint(["check", "--source-only", "--no-cache", "t.py", "--output-format", "concise"], tmp_path)
    assert result.returncode == 1 and result.stderr == "", result.stderr
    assert result.stdout.startswith("t.py:2:2: PCL599 Cannot parse the file: invalid non-printable character U+200D")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_model_that_fails_with_and_without_gradients_shows_the_failure_users_meet(tmp_path):
    """A model that writes into its input (refused with gradients) and then fails as users run it
    was reported with the gradient error, which sends its author the wrong way."""
    _model(tmp_path, """
        x.clamp_(-1, 1)
        return self.fc(x)
    """, layer="nn.Linear(5, 4)")
    result = _preclint(["check", "m.py"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "mat1 and mat2 shapes cannot be multiplied" in result.stderr and "leaf" not in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_huge_expression_the_rules_would_read_is_named_not_parsed_for_minutes(tmp_path):
    """A 10,000-term sum of ``torch.tensor(1e-8)`` holds words the rules look for, so it was kept for
    libcst, whose time grows faster than quadratically with it: minutes for one file."""
    (tmp_path / "t.py").write_text("import torch\nx = " + " + ".join(["torch.tensor(1e-8)"] * 10_000)
                                   + "\nwith torch.cuda.amp.autocast():\n    pass\n")
    result = _preclint(["check", "--source-only", "--no-cache", "t.py", "--output-format", "json"], tmp_path)
    assert result.returncode == 1, result.stderr
    found = {(f["code"], f["location"]["line"]): f["message"] for f in json.loads(result.stdout)["findings"]}
    assert "cannot check the expression at line 2: it nests 100" in found[("PCL599", 2)].lower()
    assert ("PCL502", 3) in found  # the rest of the file is checked


def test_a_failing_case_is_kept_so_a_recheck_elsewhere_checks_the_same_bytes(tmp_path, monkeypatch):
    """Source cases are built from the installed packages' test files, which differ between machines:
    a recheck by name on another machine checked other bytes than the run that failed."""
    from benchmarks.fuzz.oracle import Checked, Verdict

    kept = tmp_path / "cases"
    original = cases.build("source-7", "own")
    monkeypatch.setattr(cases, "check", lambda case, scratch=None: Checked(Verdict("crash", "boom", "crash: boom")))
    entry = cases.run_one("source-7", "own", str(tmp_path), kept)
    assert entry["failure"] == "crash" and cases.kept_path(kept, "source-7").exists()
    assert not list(kept.glob(".current-*"))

    def elsewhere(name, corpus_kind="both"):
        raise AssertionError("rebuilt from this machine's files")

    monkeypatch.setattr(cases, "build", elsewhere)
    seen = []
    monkeypatch.setattr(cases, "check", lambda case, scratch=None: seen.append(case) or Checked(Verdict(None)))
    assert cases.run_one("source-7", "own", str(tmp_path), kept, use_kept=True)["failure"] is None
    assert seen == [original]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_long_run_stops_at_its_time_budget_and_resumes(tmp_path):
    """A run given a time budget stops starting cases, logs nothing it did not finish, and the next
    run takes up the cases that are not in the log."""
    state, out = tmp_path / "state", tmp_path / "fuzz.json"

    def fuzz(*args):
        return subprocess.run([sys.executable, "-m", "benchmarks.fuzz", "--sources", "2", "--corpus", "own",
                               "--state", str(state), "--out", str(out), "--source-timeout", "60", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    stopped = fuzz("--time-budget", "0")
    assert stopped.returncode == 0 and "time budget of 0 s spent; run again to resume" in stopped.stdout, stopped.stderr
    assert not (state / "log-own.jsonl").read_text()
    resumed = fuzz("--time-budget", "600")
    assert resumed.returncode == 0 and "time budget" not in resumed.stdout, resumed.stdout + resumed.stderr
    logged = [json.loads(line)["case"] for line in (state / "log-own.jsonl").read_text().splitlines()]
    assert sorted(logged) == ["source-0", "source-1"]
    assert json.loads(out.read_text())["tried"] == {"source": 2}
