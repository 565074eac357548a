"""A report's note: one line that says how a figure was obtained or why one is missing, with the kind
of step that wrote it, so a reader (the API, a benchmark, a test) picks the probe's notes or the noise
floor's by their kind instead of by their words. Every output format shows the text alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List

# Each kind, and what its notes are about.
KINDS: Dict[str, str] = {
    "load": "how the model and its inputs were loaded: a class converted, a dtype cast, inputs drawn, "
            "outputs that are not compared",
    "capture": "how the graph was recorded: a fallback from torch.fx, state the forward changes",
    "reference": "the reference runs: the float32 statistics pass (without gradients, on the CPU, not "
                 "at all) and the probe's float64 run (in float32, not bit-exact)",
    "prediction": "what the error model assumed or could not predict",
    "training": "the training step, predicted or measured",
    "probe": "the probe's measurement: where it ran, what could not be measured and why",
    "noise": "the run-to-run noise of the reference: whether the model is deterministic",
    "mismatch": "a measured output error far from the predicted one",
    "device": "float32 on one device against float32 on another",
    "compiled": "a compiled backend beside eager",
    "warning": "a warning the model's own code raised",
    "source": "files the source check skipped or could not fix",
    "cache": "the source check's cache",
    "baseline": "the baseline of known findings",
}


@dataclass(frozen=True)
class Note:
    kind: str  # one of KINDS
    text: str  # the line every output format shows, as it is

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown note kind {self.kind!r} (known: {', '.join(KINDS)})")
        if not isinstance(self.text, str):
            raise TypeError(f"a note's text is a str, not a {type(self.text).__name__}")

    def prefixed(self, prefix: str) -> "Note":
        """The same note with ``prefix`` before its text (the probe's ``probe: `` on its notes)."""
        return Note(self.kind, prefix + self.text)


def texts(notes: Iterable[Note]) -> List[str]:
    """The notes' lines, in order, as the output formats show them."""
    return [note.text for note in notes]
