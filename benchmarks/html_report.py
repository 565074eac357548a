"""The HTML report of a large model: node count, time to write the page, its size, and the time
headless Chromium takes to open it and draw its charts (against an empty page, to take Chromium's
own start-up out).

    python benchmarks/html_report.py [--blocks 1200]

The model is a deep residual MLP of ``--blocks`` blocks (Linear, GELU, Linear, add, LayerNorm: five
nodes and one module level each), on a 4x64 input, so that the reference pass stays cheap and the
page's size and drawing are what is measured.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.act = nn.GELU()
        self.down = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(self.act(self.up(x))))


class Deep(nn.Module):
    def __init__(self, blocks: int, width: int = 64, stages: int = 12) -> None:
        super().__init__()
        per = max(1, blocks // stages)
        self.stages = nn.Sequential(*[nn.Sequential(*[Block(width) for _ in range(per)]) for _ in range(stages)])

    def forward(self, x):
        return self.stages(x)


def open_seconds(browser: str, page: Path, profile: Path) -> tuple:
    """(wall, CPU) seconds of one headless Chromium run that loads ``page``, runs its scripts and dumps
    the DOM. CPU time (all of Chromium's processes) holds on a busy machine, where wall time does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr[-2000:]
    return elapsed, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=1200)
    parser.add_argument("--out", help="also write the figures (JSON) here")
    args = parser.parse_args()

    from preclint.config import Config
    from preclint.engine import CheckOptions, check_model
    from preclint.load.loader import LoadedModel
    from preclint.report import render
    from preclint.report.html import plotly_js

    torch.manual_seed(0)
    module = Deep(args.blocks).eval()
    loaded = LoadedModel(module, (torch.randn(4, 64),), "deep", None)
    modes = ("tf32", "fp16", "bf16")
    start = time.perf_counter()
    report, graph, _ = check_model(loaded, Config(precisions=modes), CheckOptions(modes=modes))
    checked = time.perf_counter() - start
    start = time.perf_counter()
    text = render(report, "html")
    written = time.perf_counter() - start
    own = len(text.encode()) - len(plotly_js().encode())
    print(f"nodes: {len(graph.nodes)}; check {checked:.1f} s; page written in {written:.2f} s, "
          f"{len(text.encode()) / 2**20:.2f} MiB ({own / 2**20:.2f} MiB besides plotly.js)")
    figures = {"blocks": args.blocks, "nodes": len(graph.nodes), "check_s": checked, "page_written_s": written,
               "page_mib": len(text.encode()) / 2**20, "page_mib_besides_plotly": own / 2**20}
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if browser is None:
        print("no Chromium: the time to open the page is not measured")
        _write(args.out, figures)
        return
    with tempfile.TemporaryDirectory() as tmp:
        page, empty = Path(tmp) / "report.html", Path(tmp) / "empty.html"
        page.write_text(text)
        empty.write_text("<!DOCTYPE html><html><body></body></html>")
        base = [min(run) for run in zip(*(open_seconds(browser, empty, Path(tmp) / "p") for _ in range(3)))]
        full = [min(run) for run in zip(*(open_seconds(browser, page, Path(tmp) / "p") for _ in range(3)))]
    print(f"Chromium, best of 3: empty page {base[0]:.2f} s wall, {base[1]:.2f} s CPU; the report {full[0]:.2f} s "
          f"wall, {full[1]:.2f} s CPU: {full[0] - base[0]:.2f} s wall, {full[1] - base[1]:.2f} s CPU to load and draw it")
    figures["chromium_best_of_3"] = {"empty_wall_s": base[0], "empty_cpu_s": base[1], "report_wall_s": full[0],
                                     "report_cpu_s": full[1]}
    _write(args.out, figures)


def _write(path, figures) -> None:
    if path:
        with open(path, "w") as handle:
            json.dump(stamp(figures), handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
