"""A module instance held in several places (Ultralytics shares one ``nn.SiLU`` across its blocks):
each call is named after its call site, the module whose forward made it, with that call's own values;
never all after the first owner (``model.0.act``) with another block's values."""
import json
import shutil

import pytest
import torch

from preclint.capture.graph import capture
from preclint.capture.observer import Observer
from preclint.cli import main
from tests.paths import MODELS

MODEL = MODELS / "shared_activation.py"


@pytest.mark.parametrize("path", ["fx", "function-mode"])
def test_each_call_of_a_shared_module_is_named_after_its_call_site(path):
    from tests.models.shared_activation import Net

    net = Net().eval()
    graph, _ = capture(net, (torch.randn(1, 3, 16, 16),), "net", Observer(), force=path)
    acts = [n.module_path for n in graph.nodes if n.target == "nn.SiLU"]
    assert acts == ["model.0.act", "model.1.act", "model.2.act", "model.3.act"]


@pytest.mark.parametrize("path", ["fx", "function-mode"])
def test_findings_on_a_shared_module_name_the_block_whose_values_they_quote(capsys, tmp_path, monkeypatch, path):
    shutil.copy(MODEL, tmp_path / "model.py")
    monkeypatch.chdir(tmp_path)
    main(["check", "model.py", "--precision", "fp16", "--capture", path, "--output-format", "json"])
    doc = json.loads(capsys.readouterr().out)
    (underflow,) = [f for f in doc["findings"] if f["code"] == "PCL105"]
    # block 2 sits in SiLU's negative tail (RMS about 6e-9); block 0's values are ordinary
    assert underflow["module"] == "model.2.act" and "RMS 6.1" in underflow["message"]
    assert underflow["location"]["line"] == 19  # the forward that calls self.act
    assert {f["module"] for f in doc["findings"]} <= {"model.2.act", "model.2.conv", "model.3.conv", "model.3.act"}
    labels = [t["module"] for t in doc["summary"]["fp16"]["top_layers"]]
    assert "model.0.act" not in labels[:2] and len(labels) == len(set(labels))
