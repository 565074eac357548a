"""The FP8/MX/NVFP4 recipe options: [tool.preclint.scaling] and --scaling, torchao's defaults otherwise."""
from __future__ import annotations

import pytest
import torch

from preclint.core.notes import texts
from preclint.config import Config, load_config
from preclint.core.errors import UserError
from preclint.core.numerics import E4M3, E5M2, MODES, scaled_mode, scaled_recipes


def test_defaults_are_torchaos():
    tensorwise, rowwise = MODES["fp8"].recipe, MODES["fp8-rowwise"].recipe
    assert tensorwise.element is E4M3 and tensorwise.amax_epsilon == 1e-12 and tensorwise.fast_accum
    assert not tensorwise.power_of_two and rowwise.power_of_two
    assert MODES["mxfp8"].recipe.block == 32 and MODES["nvfp4"].recipe.block == 16


def test_the_file_and_the_flags_set_them(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.preclint.scaling]\nformat = "e5m2"\nkeep = ["lm_head", "*.gate"]\namax-epsilon = 0\n')
    config = load_config(str(tmp_path))
    assert config.scaling == {"format": "e5m2", "keep": ["lm_head", "*.gate"], "amax-epsilon": 0}
    config = config.with_flags(scaling={"fast-accum": "false", "format": "e4m3"})
    fp8 = scaled_mode("fp8", config.scaling).recipe
    assert fp8.element is E4M3 and not fp8.fast_accum and fp8.amax_epsilon == 0.0
    assert fp8.keeps("lm_head") and fp8.keeps("layers.3.gate") and not fp8.keeps("layers.3.up")
    assert scaled_mode("nvfp4", config.scaling).recipe.element.name == "e2m1"  # format is no NVFP4 choice


@pytest.mark.parametrize("body, message", [
    ('format = "e3m4"', "format takes e4m3 or e5m2"),
    ("amax-epsilon = -1", "amax-epsilon takes a number >= 0"),
    ("power-of-two = 1", "power-of-two takes true or false"),
    ("rounding = 'up'", "unknown scaling option 'rounding'"),
])
def test_a_bad_option_is_one_line_naming_it(tmp_path, body, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.preclint.scaling]\n{body}\n")
    with pytest.raises(UserError, match=message):
        load_config(str(tmp_path))


def test_the_modes_hold_the_options_only_while_a_walk_runs():
    with scaled_recipes({"format": "e5m2"}):
        assert MODES["fp8"].recipe.element is E5M2 and MODES["mxfp8"].recipe.element is E5M2
    assert MODES["fp8"].recipe.element is E4M3


def test_the_cli_refuses_a_bad_scaling_flag(capsys):
    from preclint.cli import main

    assert main(["check", "--scaling", "format", "m.py"]) == 2
    assert "expected OPTION=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_a_session_keeps_the_layers_the_options_name():
    from preclint.engine import Session

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    x = torch.randn(4, 32)
    with Session(Config(precisions=("fp8", "bf16"))) as session:
        converted = session.check(model, (x,)).summary["fp8"]["predicted_output"]["rel_error"]
    with Session(Config(precisions=("fp8", "bf16"), scaling={"keep": ["0", "2"]})) as session:
        report = session.check(model, (x,))
    kept = report.summary["fp8"]["predicted_output"]["rel_error"]
    assert kept == pytest.approx(report.summary["bf16"]["predicted_output"]["rel_error"]) and kept < converted / 3
    assert any(note.startswith("fp8: 0 of 2 nn.Linear layers run as scaled GEMMs") for note in texts(report.notes))


def _mlp(scale: float = 1.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    return model, (torch.randn(16, 64) * scale,)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp8", "fp8-rowwise", "nvfp4"])
def test_an_amax_floor_above_every_amax_is_an_error_not_all_checks_passed(precision):
    """`--scaling amax-epsilon=1e30` zeroed every scaled GEMM and the report said "All checks passed!"."""
    from tests.helpers import check

    model, inputs = _mlp()
    report, _, _ = check(model, inputs, precisions=(precision,), scaling={"amax-epsilon": 1e30})
    found = [f for f in report.findings if f.code == "PCL111"]
    assert {f.module for f in found} == {"0", "2"} and all(f.severity == "error" for f in found)
    assert "loses 100% of its input's nonzero values to 0" in found[0].message
    # the floor it means (torchao's 1e-12) finds nothing
    report, _, _ = check(model, inputs, precisions=(precision,))
    assert not [f for f in report.findings if f.code == "PCL111"]


@pytest.mark.slow
def test_a_floor_above_small_activations_is_found_where_it_flushes_them():
    """A floor of 1e-3 is a guard for unit-scale activations, and flushes activations of 1e-9 (below
    1e-3 x 2^-10 / 448): activations of 1e-5 it floors too, but E4M3 still holds them."""
    from tests.helpers import check

    for scale, flagged in ((1.0, False), (1e-5, False), (1e-9, True)):
        model, inputs = _mlp(scale)
        report, _, _ = check(model, inputs, precisions=("fp8",), scaling={"amax-epsilon": 1e-3})
        assert any(f.code == "PCL111" and f.module == "0" for f in report.findings) is flagged, scale


@pytest.mark.slow
def test_the_command_line_exits_1_with_the_finding(tmp_path):
    import subprocess
    import sys

    (tmp_path / "mlp.py").write_text("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear("
                                     "64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))\n"
                                     "example_inputs = (torch.randn(16, 64),)\n")
    done = subprocess.run([sys.executable, "-m", "preclint", "check", str(tmp_path / "mlp.py"), "--precision", "fp8",
                           "--scaling", "amax-epsilon=1e30", "--output-format", "concise"], capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PCL111" in done.stdout and "All checks passed" not in done.stdout
