"""`preclint check` and `preclint rule` end to end: output schema, exit codes, determinism, bad input."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import torch

from preclint.cli import main
from tests.paths import DATA, ROOT

EXAMPLE = str(ROOT / "examples" / "mixed_precision_pitfalls.py")
SCHEMA = json.loads((DATA / "report.schema.json").read_text())


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


MLP = """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(64)
            self.fc1 = nn.Linear(64, 256)
            self.fc2 = nn.Linear(256, 64)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))

    example_inputs = (torch.randn(8, 64),)
"""


@pytest.fixture(scope="module")
def example_json():
    code = main(["check", EXAMPLE, "--output-format", "json", "--exit-zero"])
    assert code == 0
    return None


@pytest.mark.slow
def test_example_json_matches_schema_and_reports_the_pitfalls(capsys):
    code, out, err = run(capsys, "check", EXAMPLE, "--output-format", "json")
    assert code == 1, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["capture"] == "fx"
    assert doc["precisions"] == ["tf32", "fp16", "bf16"]
    codes = {f["code"] for f in doc["findings"]}
    assert codes == {"PCL101"}  # the depthwise convs matter to engines only (PCL205 under fp16-full)
    overflow = next(f for f in doc["findings"] if f["code"] == "PCL101")
    assert overflow["precisions"] == ["fp16"]  # bfloat16 has float32's range
    assert overflow["location"]["path"] == "examples/mixed_precision_pitfalls.py" or overflow["location"]["path"].endswith(
        "mixed_precision_pitfalls.py")
    assert doc["summary"]["fp16"]["predicted_output"]["finite"] is False
    assert doc["summary"]["bf16"]["predicted_output"]["finite"] is True
    rel = doc["summary"]["bf16"]["predicted_output"]["rel_error"]
    assert 1e-3 < rel < 3e-2  # bf16's unit roundoff is 3.9e-3


@pytest.mark.slow
def test_output_is_byte_identical_on_rerun(capsys):
    for fmt in ("json", "full", "concise"):
        first = run(capsys, "check", EXAMPLE, "--output-format", fmt, "--exit-zero")[1]
        second = run(capsys, "check", EXAMPLE, "--output-format", fmt, "--exit-zero")[1]
        assert first == second, fmt
        assert first


@pytest.mark.slow
def test_well_scaled_block_has_no_findings_and_exits_zero(capsys, tmp_path):
    path = write(tmp_path, "mlp.py", MLP)
    code, out, err = run(capsys, "check", path, "--output-format", "json")
    doc = json.loads(out)
    assert doc["findings"] == [], doc["findings"]
    assert code == 0
    for mode in ("tf32", "fp16", "bf16"):
        assert doc["summary"][mode]["predicted_output"]["finite"] is True


@pytest.mark.slow
def test_fail_on_and_exit_zero(capsys):
    # the example's PCL205 (under fp16-full) is info, its PCL101 errors
    engine = ("--precision", "fp16-full")
    assert run(capsys, "check", EXAMPLE, *engine, "--select", "PCL205")[0] == 0  # info is below the default warning
    assert run(capsys, "check", EXAMPLE, *engine, "--select", "PCL205", "--fail-on", "info")[0] == 1
    assert run(capsys, "check", EXAMPLE, "--exit-zero")[0] == 0
    assert run(capsys, "check", EXAMPLE, "--fail-on", "error")[0] == 1


@pytest.mark.slow
def test_select_and_ignore_filter_codes(capsys):
    out = run(capsys, "check", EXAMPLE, "--output-format", "json", "--precision", "fp16-full", "--ignore", "PCL1")[1]
    assert {f["code"] for f in json.loads(out)["findings"]} == {"PCL205"}
    out = run(capsys, "check", EXAMPLE, "--output-format", "json", "--select", "PCL101")[1]
    assert {f["code"] for f in json.loads(out)["findings"]} == {"PCL101"}


@pytest.mark.slow
def test_precision_flag_chooses_the_modes(capsys):
    out = run(capsys, "check", EXAMPLE, "--output-format", "json", "--precision", "bf16,fp16-full")[1]
    doc = json.loads(out)
    assert doc["precisions"] == ["bf16", "fp16-full"]
    assert set(doc["summary"]) == {"bf16", "fp16-full"}
    assert any(f["code"] == "PCL101" and f["precisions"] == ["fp16-full"] for f in doc["findings"])


@pytest.mark.slow
def test_module_attr_target_with_input_shape(capsys):
    code, out, err = run(capsys, "check", "torchvision.models:resnet18", "--input-shape", "1,3,64,64",
                         "--output-format", "json")
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["model"] == "torchvision.models:resnet18"
    assert doc["capture"] == "fx"
    assert doc["summary"]["tf32"]["predicted_output"]["rel_error"] > 0


def test_no_run_uses_graph_and_weights_only(capsys):
    code, out, err = run(capsys, "check", EXAMPLE, "--no-run", "--output-format", "json", "--precision", "fp16,fp16-full")
    doc = json.loads(out)
    assert any("--no-run" in note for note in doc["notes"])
    codes = {f["code"] for f in doc["findings"]}
    assert "PCL205" in codes and "PCL101" not in codes  # kernels need no statistics; overflow does
    for finding in doc["findings"]:
        if finding["code"] != "PCL205":  # rules that cannot decide say so instead of guessing
            assert finding["severity"] == "info" and "--no-run" in finding["message"], finding
    assert doc["summary"]["fp16"]["predicted_output"]["rel_error"] is None


def test_rule_command_prints_documentation(capsys):
    code, out, err = run(capsys, "rule", "PCL103")
    assert code == 0
    assert out.startswith("PCL103 batchnorm-scale")
    for section in ("Why it matters", "Example", "Fix"):
        assert section in out
    code, out, _ = run(capsys, "rule", "fp16-overflow")
    assert code == 0 and out.startswith("PCL101")
    code, out, _ = run(capsys, "rule", "--all")
    assert code == 0
    for rule_code in ("PCL001", "PCL101", "PCL103", "PCL205", "PCL301"):
        assert f"\n{rule_code} " in "\n" + out
    code, out, err = run(capsys, "rule", "PCL777")
    assert code == 2 and out == "" and err.count("\n") == 1


# ------------------------------------------------------------------------------------ bad input

NEEDS_ARGS = """
    import torch
    class Net(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = torch.nn.Linear(width, width)
"""
RAISES_IN_FORWARD = """
    import torch
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
        def forward(self, x):
            raise ValueError("boxes must be a list")
    example_inputs = (torch.randn(2, 4),)
"""
LINEAR = """
    import torch
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
        def forward(self, x):
            return self.fc(x)
"""


def bad_inputs(tmp_path):
    linear = write(tmp_path, "linear.py", LINEAR)
    good_ckpt, wrong_ckpt, pickle_ckpt = tmp_path / "ok.pt", tmp_path / "wrong.pt", tmp_path / "pickle.pt"
    torch.save({"fc.weight": torch.zeros(4, 4), "fc.bias": torch.zeros(4)}, good_ckpt)
    torch.save({"head.weight": torch.zeros(4, 4)}, wrong_ckpt)
    torch.save({"fc.weight": torch.zeros(4, 4), "note": object.__new__(SomeObject)}, pickle_ckpt)
    return [
        (["check", str(tmp_path / "missing.py")], "missing.py"),
        (["check", write(tmp_path, "syntax.py", "def broken(:\n    pass\n")], "syntax.py:1"),
        (["check", write(tmp_path, "imports.py", "import torch\nimport not_a_module_anywhere\n")],
         "not_a_module_anywhere"),
        (["check", write(tmp_path, "empty.py", "x = 1\n")], "nn.Module"),
        (["check", write(tmp_path, "needs_args.py", NEEDS_ARGS), "--input-shape", "2,4"], "width"),
        (["check", linear], "--input"),
        (["check", linear, "--input", "x=2x4:int64:5..1"], "LOW < HIGH"),
        (["check", linear, "--input", "inputs=2x4"], "Net.forward() has no parameter 'inputs' (its parameters: x)"),
        (["check", linear, "--input", "x=2x4", "--input-shape", "2,4"], "not both"),
        (["check", linear, "--input-shape", "2,5"], "failed on its example inputs"),
        (["check", linear, "--input-shape", "2,x"], "2,x"),
        (["check", write(tmp_path, "raises.py", RAISES_IN_FORWARD)], "boxes must be a list"),
        (["check", linear, "--input-shape", "2,4", "--weights", str(wrong_ckpt)], "head.weight"),
        (["check", linear, "--input-shape", "2,4", "--weights", str(pickle_ckpt)], "weights"),
        (["check", linear, "--input-shape", "2,4", "--precision", "fp6"], "fp6"),
        (["check", linear, "--input-shape", "2,4", "--select", "XYZ1"], "XYZ1"),
        (["check", linear, "--input-shape", "2,4", "--weights", str(good_ckpt), "--output-format", "yaml"], "yaml"),
    ]


class SomeObject:
    pass


@pytest.mark.slow
def test_bad_input_ends_in_one_line_and_exit_2(capsys, tmp_path):
    for argv, needle in bad_inputs(tmp_path):
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv, out, err)
        assert out == "", (argv, out)  # never a partial document on stdout
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert "Traceback" not in err
        assert needle in lines[0], (argv, lines[0])


def test_debug_shows_the_traceback(capsys, tmp_path):
    linear = write(tmp_path, "linear.py", LINEAR)
    code, out, err = run(capsys, "check", linear, "--input-shape", "2,5", "--debug")
    assert code == 2
    assert "Traceback" in err


@pytest.mark.slow
@pytest.mark.subprocess
def test_console_script_and_module_entry_point(tmp_path):
    path = write(tmp_path, "mlp.py", MLP)
    for argv in (["-m", "preclint", "check", path, "--output-format", "concise"],):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "preclint", "check", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "nope.py" in proc.stderr
