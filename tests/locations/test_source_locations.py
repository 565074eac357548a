"""locate_definitions / definition_location / locate_calls on model files (parsed, never imported)."""
from __future__ import annotations

import textwrap

from preclint.core.findings import Location
from preclint.locations.definitions import definition_location, locate_calls, locate_definitions

MODEL = textwrap.dedent(
    """\
    import torch.nn as nn
    from collections import OrderedDict

    raise RuntimeError("this file must never be executed by preclint")


    class Block(nn.Module):
        def __init__(self, blocks):
            super().__init__()
            self.conv2 = nn.Conv2d(64, 64, 3)
            self.layers = nn.Sequential(
                nn.Conv2d(3, 8, 3),
                nn.ReLU(),
            )
            self.stages = nn.Sequential(*blocks)
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 4)])
            self.table = nn.ModuleDict({"cls": nn.Linear(8, 2)})
            self.named = nn.Sequential(OrderedDict([("fc", nn.Linear(1, 1))]))
            setattr(self, "extra", nn.Identity())
            self.add_module("proj", nn.Linear(8, 8))

        def forward(self, x):
            x = self.conv2(x)
            return self.proj(self.layers(x))


    class Other(nn.Module):
        def __init__(me):
            super().__init__()
            me.conv2 = nn.Conv2d(1, 1, 1)
    """
)


def test_definitions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text(MODEL)
    found = locate_definitions("pkg/model.py")
    at = lambda line, col: Location("pkg/model.py", line, col)  # noqa: E731
    assert found[("Block", "conv2")] == at(10, 9)
    assert found[("Block", "layers")] == at(11, 9)
    assert found[("Block", "layers.0")] == at(12, 13)
    assert found[("Block", "layers.1")] == at(13, 13)
    assert found[("Block", "heads.1")] == at(16, 54)
    assert found[("Block", "table.cls")].line == 17
    assert found[("Block", "named.fc")].line == 18
    assert found[("Block", "extra")] == at(19, 9)
    assert found[("Block", "proj")] == at(20, 9)
    assert found[("Other", "conv2")] == at(30, 9)
    assert ("Block", "stages.0") not in found


def test_definition_location_falls_back_to_the_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    assert definition_location("model.py", "Block", "stages.3.conv1").line == 15
    assert definition_location("model.py", "Block", "layers.0.weight").line == 12
    assert definition_location("model.py", "Block", "missing") is None
    assert definition_location("missing.py", "Block", "conv2") is None


def test_calls_in_forward(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    calls = locate_calls("model.py")
    assert calls[("Block", "conv2")] == [Location("model.py", 23, 13)]
    assert [loc.line for loc in calls[("Block", "layers")]] == [24]
    assert ("Block", "extra") not in calls


def test_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path / "src")
    assert locate_definitions(str(tmp_path / "src" / "model.py"))[("Block", "conv2")].path == "model.py"


def test_unparsable_file_gives_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("class A(:\n")
    assert locate_definitions("bad.py") == {}
