"""A suppression on a line that holds a bidirectional control character is void and reported (Trojan
Source): ``# x \\u202e # preclint: ignore[PCL502]`` shows in an editor or a review as reversed text, not
as a suppression, and used to silence the finding ("All checks passed!", exit 0)."""
from __future__ import annotations

import pytest

from preclint.cli import main
from preclint.source.run import check_text

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()"
# every bidirectional control: embeddings and overrides, isolates, the marks
CONTROLS = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
            "\u200e", "\u200f", "\u061c"]
HIDDEN = "import torch\n\nwith torch.cuda.amp.autocast():  # \u202e # preclint: ignore[PCL502]\n    y = 1\n"


def codes(text):
    return [f.code for f in check_text(text, "pkg/m.py")]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "m.py").write_text(HIDDEN, encoding="utf-8")
    return tmp_path


def test_a_suppression_hidden_behind_an_override_is_void_and_reported(project, capsys):
    for _ in range(2):  # a cold run, then one answered by the cache
        code = main(["check", "--source-only", "m.py", "--output-format", "concise"])
        out = capsys.readouterr().out
        assert code == 1, out
        assert "m.py:3:6: PCL502" in out  # the finding the comment hid
        assert ("m.py:3:38: PCL500 Suppression ignored: the line holds the bidirectional control character U+202E, "
                "which makes it read differently") in out
        assert "\u202e" not in out
    (project / "m.py").write_text(HIDDEN.replace("\u202e ", ""), encoding="utf-8")  # the same comment in plain sight
    assert main(["check", "--source-only", "m.py", "--output-format", "concise"]) == 0


@pytest.mark.parametrize("control", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
@pytest.mark.parametrize("comment", ["# preclint: ignore[PCL502]", "# preclint: ignore", "# noqa: PCL502", "# noqa"])
def test_every_bidirectional_control_voids_every_form(control, comment):
    assert codes(f"{BAD}  {comment}\n") == []  # honoured without it
    assert codes(f"{BAD}  {comment} {control}\n") == ["PCL502", "PCL500"]  # after the directive
    assert codes(f"{BAD}  # {control} {comment}\n") == ["PCL502", "PCL500"]  # before it, in the comment


def test_a_control_anywhere_on_the_line_voids_it_and_one_on_another_line_does_not():
    assert codes('import torch\ns = "\u2067"; scaler = torch.cuda.amp.GradScaler()  # noqa: PCL502\n') == [
        "PCL502", "PCL500"]  # in a string before the comment: it can move the comment into the string
    assert codes(f'{BAD}  # noqa: PCL502\ns = "\u202e"\n') == []


def test_a_void_suppression_is_reported_with_the_rule_selected_only():
    from preclint.config import Config

    text = f"{BAD}  # noqa: PCL502 \u202e\n"
    found = check_text(text, "pkg/m.py", Config(ignore=["PCL500"]))
    assert [f.code for f in found] == ["PCL502"]  # void all the same: the finding stands
