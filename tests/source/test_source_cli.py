"""preclint check --source-only end to end: exit codes, fixes, diffs, baselines, bad input."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from preclint.cli import main

AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"
TF32 = "import torch\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n"




def run(capsys, *args):
    code = main(["check", "--source-only", "--output-format", "concise", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.subprocess
def test_never_imports_torch_or_the_checked_code(project):
    (project / "pkg" / "m.py").write_text(AMP + "raise SystemExit('executed')\n")
    code = (
        "import sys\n"
        "from preclint.cli import main\n"
        "rc = main(['check', '--source-only', '--output-format', 'sarif', 'pkg'])\n"
        "assert rc == 1, rc\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'numpy'))\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_exit_codes(project, capsys):
    (project / "pkg" / "m.py").write_text(AMP)
    assert run(capsys, "pkg")[0] == 1
    assert run(capsys, "--exit-zero", "pkg")[0] == 0
    assert run(capsys, "--fail-on", "error", "pkg")[0] == 0
    assert run(capsys, "--ignore", "PCL502", "pkg")[0] == 0
    code, out, _ = run(capsys, "--select", "PCL501", "pkg")
    assert code == 0 and out == "All checks passed!\n"


def test_a_directory_without_python_files_is_an_error_not_a_pass(project, capsys):
    (project / "pkg" / "README.md").write_text("no python here\n")
    code, out, err = run(capsys, "pkg")
    assert (code, out) == (2, "") and "no Python file was checked under pkg" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--select", "PCL5999", "pkg"], "unknown rule code or prefix 'PCL5999'"),
        (["--ignore", "E501", "pkg"], "unknown rule code or prefix 'E501'"),
        (["missing.py"], "missing.py: no such file or directory"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(project, capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("preclint: error: ") and message in err


def test_bad_config_key_is_exit_2(project, capsys):
    (project / "pyproject.toml").write_text("[tool.preclint]\nselect = ['PCL5']\nfail_on = 'error'\n")
    code, _, err = run(capsys, "pkg")
    assert code == 2 and "unknown key 'fail_on'; did you mean 'fail-on'?" in err and err.count("\n") == 1


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a user that file modes apply to")
def test_unreadable_file_is_reported_and_the_run_goes_on(project, capsys):
    path = project / "pkg" / "m.py"
    path.write_text(AMP)
    path.chmod(0)
    (project / "pkg" / "n.py").write_text(AMP)
    code, out, _ = run(capsys, "pkg")
    assert code == 1 and "pkg/m.py:1:1: PCL599 Cannot read the file: Permission denied." in out
    assert "pkg/n.py:3:6: PCL502" in out


def test_unparsable_file_is_reported_and_the_run_goes_on(project, capsys):
    (project / "pkg" / "bad.py").write_text("import torch\nwith torch.cuda.amp.autocast(:\n    pass\n")
    (project / "pkg" / "good.py").write_text(AMP)
    code, out, _ = run(capsys, "pkg")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "pkg/bad.py:2:30: PCL599 Cannot parse the file: invalid syntax."
    assert lines[1].startswith("pkg/good.py:3:6: PCL502 [*]")


def test_fix_writes_in_place_keeping_bytes_and_mode(project, capsys):
    path = project / "pkg" / "m.py"
    original = AMP.replace("\n", "\r\n").replace("import torch", "import torch  # ünïcode comment")
    path.write_bytes(original.encode("utf-8"))
    path.chmod(0o750)
    code, out, err = run(capsys, "--fix", "pkg")
    assert code == 0 and out == "All checks passed!\n" and "Fixed 1 finding." in err
    fixed = original.replace("torch.cuda.amp.autocast()", 'torch.autocast("cuda", dtype=torch.float16)')
    assert path.read_bytes() == fixed.encode("utf-8")
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert sorted(os.listdir(project / "pkg")) == ["m.py"]  # no temporary file left


def test_diff_shows_fixes_and_writes_nothing(project, capsys):
    path = project / "pkg" / "m.py"
    path.write_text(AMP)
    code, out, _ = run(capsys, "--diff", "pkg")
    assert code == 1
    assert out.splitlines()[:2] == ["--- a/pkg/m.py", "+++ b/pkg/m.py"]
    assert '+with torch.autocast("cuda", dtype=torch.float16):' in out and "-with torch.cuda.amp.autocast():" in out
    assert path.read_text() == AMP
    path.write_text('import torch\n\nwith torch.autocast("cuda"):\n    pass\n')
    assert run(capsys, "--diff", "pkg")[:2] == (0, "")


def test_fix_never_leaves_a_half_written_file(project, capsys, monkeypatch):
    path = project / "pkg" / "m.py"
    path.write_text(AMP)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    code, _, err = run(capsys, "--fix", "pkg")
    assert code == 2 and "pkg/m.py: not fixed: cannot write it: No space left on device; the file is unchanged" in err
    assert path.read_text() == AMP
    assert sorted(os.listdir(project / "pkg")) == ["m.py"]


def test_baseline_adopts_existing_findings_and_survives_line_shifts(project, capsys):
    path = project / "pkg" / "m.py"
    path.write_text(TF32 + AMP)
    code, _, _ = run(capsys, "--write-baseline", "baseline.json", "pkg")
    assert code == 0
    recorded = json.loads((project / "baseline.json").read_text())
    assert [r["code"] for r in recorded["findings"]] == ["PCL502", "PCL504"]
    assert run(capsys, "--baseline", "baseline.json", "pkg")[:2] == (0, "All checks passed!\n")
    # lines move: still known; a second copy of a known line is new
    path.write_text("\n\n# moved\n" + TF32 + AMP + "torch.backends.cuda.matmul.allow_tf32 = True\n")
    code, out, _ = run(capsys, "--baseline", "baseline.json", "pkg")
    assert code == 1 and out.splitlines() == [
        "pkg/m.py:11:1: PCL504 `torch.backends.cuda.matmul.allow_tf32` is set when this module is imported: "
        "it changes TF32 for every program that imports it.",
        "Found 1 finding.",
    ]


def test_baseline_errors(project, capsys):
    (project / "pkg" / "m.py").write_text(AMP)
    (project / "bad.json").write_text("{}")
    code, _, err = run(capsys, "--baseline", "bad.json", "pkg")
    assert code == 2 and "not a preclint baseline" in err
    code, _, err = run(capsys, "--baseline", "none.json", "pkg")
    assert code == 2 and "none.json: cannot read the baseline" in err


def test_output_is_deterministic(project, capsys):
    (project / "pkg" / "a.py").write_text(AMP)
    (project / "pkg" / "b.py").write_text(TF32)
    outputs = set()
    for _ in range(2):
        for fmt in ("concise", "sarif", "github", "rdjson", "json"):
            main(["check", "--source-only", "--output-format", fmt, "pkg"])
        outputs.add(capsys.readouterr().out)
    assert len(outputs) == 1
