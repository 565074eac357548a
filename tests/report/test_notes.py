"""A check's notes, end to end: each a Note with the kind of the step that wrote it, shown by every
output format as its text alone (the JSON's ``notes`` a list of strings, as ever), and read by the
Python API as strings."""
import json

import torch
from torch import nn

import preclint
from preclint.config import Config
from preclint.core.notes import KINDS, Note, texts
from preclint.engine import Session
from preclint.probe import ProbeOptions
from preclint.report import render


class _WithLabel(nn.Module):
    """A float output beside one that is no tensor: the load step notes that it is not compared."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x), "label"


def test_a_probed_check_s_notes_are_typed_and_rendered_as_their_text():
    torch.manual_seed(0)
    report = Session(Config(precisions=("fp16",)), probe=ProbeOptions(device="cpu")).check(_WithLabel().eval(),
                                                                                         torch.randn(4, 16))
    assert report.notes and all(isinstance(note, Note) and note.kind in KINDS for note in report.notes)
    kinds = {note.text.split(":")[0]: note.kind for note in report.notes}
    assert kinds["outputs that are not tensors were not compared"] == "load"
    assert kinds["probe"] == "probe"  # "probe: emulated on ...", first of the probe's
    assert json.loads(render(report, "json"))["notes"] == texts(report.notes)
    full = render(report, "full", color=False)
    assert all(f"note: {note.text[:40]}" in full for note in report.notes)


def test_the_api_reads_the_notes_as_strings_beside_the_caveats():
    report = preclint.check(_WithLabel().eval(), torch.randn(4, 16), precisions=("fp16",))
    assert report.notes[:1] == ["outputs that are not tensors were not compared: output[1] (str)"]
    assert all(isinstance(note, str) for note in report.notes)
