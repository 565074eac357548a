"""[tool.preclint] discovery, validation, and flags over config."""
from __future__ import annotations

import pytest

from preclint.config import Config, find_config, known_codes, load_config
from preclint.core.errors import UserError

# a family no rule uses, whatever rules are added later
UNUSED = next(f"PCL{n}" for n in range(9, -1, -1) if not any(c.startswith(f"PCL{n}") for c in known_codes()))


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_closest_pyproject_with_a_preclint_table_wins(tmp_path, monkeypatch):
    write(tmp_path / "pyproject.toml", "[tool.preclint]\nselect = ['PCL5']\n")
    write(tmp_path / "a" / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.preclint]: skipped
    write(tmp_path / "a" / "b" / "pyproject.toml", "[tool.preclint]\nignore = ['PCL504']\n")
    (tmp_path / "a" / "b" / "c").mkdir()
    monkeypatch.chdir(tmp_path / "a" / "b" / "c")
    assert find_config() == str(tmp_path / "a" / "b" / "pyproject.toml")
    config = load_config()
    assert config.ignore == ["PCL504"] and config.select is None  # parents are not merged
    monkeypatch.chdir(tmp_path / "a")
    assert load_config().select == ["PCL5"]
    assert load_config(isolated=True) == Config()


def test_every_key(tmp_path):
    write(
        tmp_path / "pyproject.toml",
        """
[tool.preclint]
select = ["PCL1", "PCL5"]
ignore = ["PCL504"]
extend-select = ["PCL001"]
precisions = ["fp16", "bf16-full"]
rtol = 1e-3
atol = 0
fail-on = "error"
exclude = ["third_party/"]
output-format = "concise"

[tool.preclint.per-file-ignores]
"tests/**" = ["PCL501"]
""",
    )
    config = load_config(str(tmp_path))
    assert config.select == ["PCL1", "PCL5"] and config.ignore == ["PCL504"] and config.extend_select == ["PCL001"]
    assert config.precisions == ("fp16", "bf16-full") and config.rtol == 1e-3 and config.atol == 0.0
    assert config.fail_on == "error" and config.exclude == ["third_party/"] and config.output_format == "concise"
    assert config.root == str(tmp_path)
    assert config.ignored_for_file(str(tmp_path / "tests" / "unit" / "test_a.py"), "PCL501")
    assert not config.ignored_for_file(str(tmp_path / "tests" / "unit" / "test_a.py"), "PCL502")
    assert not config.ignored_for_file(str(tmp_path / "src" / "a.py"), "PCL501")


@pytest.mark.parametrize(
    "body, message",
    [
        ("selct = ['PCL5']", "unknown key 'selct'"),
        ("extend_select = ['PCL5']", "did you mean 'extend-select'?"),
        (f"select = ['{UNUSED}']", f"unknown rule code or prefix '{UNUSED}'"),
        ("select = 'PCL501'\nignore = ['F401']", "unknown rule code or prefix 'F401'"),
        ("precisions = ['fp6']", "unknown precision 'fp6'"),
        ("rtol = -1", "rtol must be a finite number >= 0"),
        ("rtol = nan", "rtol must be a finite number >= 0, not nan"),
        ("atol = inf", "atol must be a finite number >= 0, not inf"),
        ("atol = 1" + "0" * 400, "atol must be a finite number >= 0"),
        ("rtol = 'small'", "rtol must be a number"),
        ("timeout = -5", "timeout must be a finite number >= 0"),
        ("timeout = '10s'", "timeout must be a number"),
        ("precisions = []", "precisions names no precision"),
        ("select = []", "select names no rule"),
        ("ignore = ['ALL']", "leaves no rule to run"),
        ("exclude = ['[z-a]']", "exclude: invalid glob '[z-a]'"),
        ("[tool.preclint.per-file-ignores]\n'tests/[9-0]*' = ['PCL501']", "per-file-ignores: invalid glob"),
        ("fail-on = 'never'", "fail-on must be one of info, warning, error"),
        ("output-format = 'xml'", "output-format must be one of"),
        (f"[tool.preclint.per-file-ignores]\n'x.py' = ['{UNUSED}']", "per-file-ignores['x.py']"),
        ("select = [", "invalid TOML"),
    ],
)
def test_bad_configuration_is_a_user_error(tmp_path, body, message):
    write(tmp_path / "pyproject.toml", "[tool.preclint]\n" + body + "\n")
    with pytest.raises(UserError, match="pyproject.toml") as caught:
        load_config(str(tmp_path))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_flags_override_the_file():
    base = Config(select=["PCL5"], ignore=["PCL504"], extend_select=["PCL001"], fail_on="error")
    # --select starts the selection afresh, as in Ruff
    flagged = base.with_flags(select=["PCL504"])
    assert flagged.is_selected("PCL504") and not flagged.is_selected("PCL501") and not flagged.is_selected("PCL001")
    # --ignore and --extend-select add to the file's
    flagged = base.with_flags(ignore=["PCL501"], extend_select=["PCL101"])
    assert not flagged.is_selected("PCL501") and not flagged.is_selected("PCL504") and flagged.is_selected("PCL101")
    assert base.with_flags(fail_on="info", rtol=None).fail_on == "info"
    assert base.with_flags(rtol=None).rtol is None
    with pytest.raises(UserError, match="command line: select"):
        base.with_flags(select=["XYZ1"])


def test_explicit_config_file(tmp_path, monkeypatch):
    write(tmp_path / "custom.toml", "select = ['PCL502']\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(config_file="custom.toml").select == ["PCL502"]
    with pytest.raises(UserError, match="missing.toml: no such configuration file"):
        load_config(config_file="missing.toml")
    (tmp_path / "conf.d").mkdir()
    with pytest.raises(UserError, match="conf.d: is a directory"):
        load_config(config_file="conf.d")


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"rtol": float("nan")}, "rtol must be a finite number >= 0, not nan"),
        ({"atol": float("inf")}, "atol must be a finite number >= 0, not inf"),
        ({"precisions": []}, "precisions names no precision"),  # --precision '' and --precision ,,,
        ({"select": []}, "select names no rule"),  # --select ''
        ({"select": ["PCL1"], "ignore": ["PCL1"]}, "leaves no rule to run"),
    ],
)
def test_flags_that_would_check_nothing_or_compare_with_nan_are_errors(flags, message):
    with pytest.raises(UserError, match="command line") as caught:
        Config().with_flags(**flags)
    assert message in str(caught.value)


def test_timeout_from_the_file_and_the_flag(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.preclint]\ntimeout = 30\n")
    config = load_config(str(tmp_path))
    assert config.timeout == 30.0
    assert config.with_flags(timeout=0.0).timeout == 0.0  # 0: no limit
    assert Config().timeout > 0  # a limit unless the user lifts it


def test_cli_uses_the_config(tmp_path, monkeypatch, capsys):
    from preclint.cli import main

    write(tmp_path / "pyproject.toml", "[tool.preclint]\noutput-format = 'concise'\nignore = ['PCL502']\n")
    write(tmp_path / "pkg" / "m.py", "import torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["check", "--source-only", "pkg"]) == 0
    assert capsys.readouterr().out == "All checks passed!\n"
    assert main(["check", "--source-only", "--select", "PCL502", "pkg"]) == 1
    assert main(["check", "--source-only", "--isolated", "--output-format", "concise", "pkg"]) == 1
    assert "PCL502" in capsys.readouterr().out
