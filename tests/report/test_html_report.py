"""--output-format html and --output FILE: a self-contained page, the same report in a file as on
stdout, and the page opened in a real browser (headless Chromium) with its charts drawn."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preclint.core.notes import Note
from preclint.cli import main
from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.report import FORMATS, Report, render
from preclint.report.html import PlanSection, render_many

NET = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.fc1(x) * 1000.0
        return self.fc2(h * h)  # above float16's range
"""
ARGS = ["--model", "Net", "--input-shape", "2,16"]


@pytest.fixture
def net(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET)
    return tmp_path


def page_data(text: str) -> list:
    return [json.loads(block.replace("<\\/", "</"))
            for block in re.findall(r"<script type='application/json' class='report-data'>(.*?)</script>", text, re.S)]


@pytest.mark.slow
def test_check_writes_one_self_contained_page(net, capsys):
    code = main(["check", "net.py", *ARGS, "--output-format", "html", "--output", "report.html"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", err  # findings: exit 1; the page goes to the file, nothing to stdout
    text = (net / "report.html").read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=['\"]?(https?:)?//", text)  # nothing from a network
    assert "plotly.js v" in text  # the chart library, inlined
    (data,) = page_data(text)
    assert data["precisions"] == ["tf32", "fp16", "bf16"]
    assert [name for name in data["nodes"]["modules"] if name] and len(data["nodes"]["names"]) >= 4
    fp16 = data["nodes"]["series"]["fp16"]
    assert any(v and v > 0 for v in fp16["pl"]) and any(v and v > 0 for v in fp16["pr"])
    # every finding on the chart links to its card, which shows the source line, the numbers and the fix
    refs = [ref for refs in data["findings"].values() for ref in refs]
    assert refs and all(f"id='{ref['id']}'" in text for ref in refs)
    assert "PCL101" in text and "Fix:</b>" in text and "<span class='hit'>" in text and "h * h)  # above" in text
    assert "torch.backends.cuda.matmul.allow_tf32" in text  # the environment record


@pytest.mark.slow
def test_output_file_holds_what_stdout_would_for_every_format(net, capsys):
    for fmt in FORMATS:
        if fmt == "html":
            continue
        main(["check", "net.py", *ARGS, "--output-format", fmt, "--exit-zero"])
        printed = capsys.readouterr().out
        main(["check", "net.py", *ARGS, "--output-format", fmt, "--exit-zero", "--output", f"out.{fmt}"])
        assert capsys.readouterr().out == ""
        assert (net / f"out.{fmt}").read_text() == printed, fmt


def test_a_page_is_not_printed_on_a_terminal(net, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["check", "net.py", *ARGS, "--output-format", "html"]) == 2
    assert "write it to a file with --output FILE" in capsys.readouterr().err


def test_output_mistakes_end_in_one_line(net, capsys):
    assert main(["check", "net.py", *ARGS, "--output", "net.py"]) == 2
    assert "is code preclint checks" in capsys.readouterr().err
    assert main(["check", "net.py", *ARGS, "--output", str(net / "missing" / "r.html")]) == 2
    assert "the directory does not exist" in capsys.readouterr().err
    assert (net / "net.py").read_text() == NET


def test_source_only_writes_to_output_too(net, capsys):
    (net / "train.py").write_text("import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n")
    assert main(["check", "--source-only", "train.py", "--output-format", "html", "-o", "src.html"]) == 1
    text = (net / "src.html").read_text()
    assert "PCL502" in text and "torch.cuda.amp.autocast()" in text and capsys.readouterr().out == ""


def large_report(nodes: int = 6000) -> Report:
    """A probed report of a model with ``nodes`` nodes in 3 levels of modules (encoder.layer.N.part)."""
    modes = ("tf32", "fp16", "bf16")
    profile, ledger = [], []
    for i in range(nodes):
        module = f"encoder.layer.{i // 60}.{['attn', 'mlp', 'norm'][i % 3]}"
        predicted = {m: {"local": 1e-4 * (1 + i % 7), "received": 1e-3 + i * 1e-7, "share": 1.0 / nodes} for m in modes}
        measured = {m: {"local": {"rel_error": 2e-4}, "received": {"rel_error": 2e-3}, "contribution": -0.5 / nodes}
                    for m in modes}
        row = {"node": f"n{i}", "module": module, "op": "nn.Linear", "kind": "linear", "location": None}
        profile.append({**row, "modes": predicted})
        ledger.append({**row, "modes": measured})
    hot = Finding("PCL101", "fp16-overflow", "error", "encoder.layer.7.mlp overflows float16 under fp16.",
                  "Use bfloat16.", location=Location("model.py", 3, 1), precisions=("fp16",),
                  module="encoder.layer.7.mlp", op="nn.Linear", node="n421",
                  predicted={"fp16": ErrorFigure(None, None)}, measured={"fp16": ErrorFigure(5e-2, 1.0, status="confirmed")},
                  status="confirmed")
    summary = {m: {"predicted_output": {"rel_error": 1e-3, "max_abs_error": 1e-2, "finite": True},
                   "measured_output": {"rel_error": 2e-3, "max_abs_error": 2e-2, "finite": m != "fp16"}} for m in modes}
    return Report(findings=[hot], model="model.py:Big", capture="fx", precisions=modes, summary=summary,
                  tolerance={"rtol": 1e-3, "atol": 1e-5}, environment={"torch": "2.x", "flags": {"f": True}},
                  profile=profile, ledger=ledger, notes=[Note("probe", "probe: emulated")])


@pytest.mark.slow
def test_a_large_model_is_one_page_of_modest_size():
    text = render(large_report(), "html")
    (data,) = page_data(text)
    assert len(data["nodes"]["names"]) == 6000
    assert len(text) - len(re.search(r"<script>(.*?)</script>", text, re.S).group(1)) < 1_500_000
    assert data["findings"] == {"421": [{"id": f"{data['anchor']}-f0", "code": "PCL101", "severity": "error",
                                         "status": "confirmed", "modes": ["fp16"]}]}
    assert re.fullmatch(r"preclint-[0-9a-f]{12}-m0", data["anchor"])


def test_the_plan_is_a_section_of_the_page():
    plan = PlanSection("Keep 2 layers in float32.", ["layer", "dtype"], [["fc1", "float32"], ["fc2", "bfloat16"]],
                       {"x": ["none", "fc1"], "series": {"fp16": [1e-2, 1e-4]}, "y_title": "rel. error", "log": True})
    text = render_many([large_report(30)], plan=plan)
    assert "<h2>Plan</h2>" in text and "Keep 2 layers in float32." in text
    assert f"id='{page_data(text)[0]['anchor']}-plan'" in text
    assert page_data(text)[0]["plan"]["series"] == {"fp16": [1e-2, 1e-4]}


def chromium():
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None)


def open_in_browser(page: Path, tmp_path: Path, screenshot: bool = True):
    """(the DOM after the page's scripts ran, its console messages, the screenshot of the page saved
    beside it, or None) from headless Chromium."""
    browser = chromium()
    assert browser, "PRECLINT_REQUIRE_BROWSER is set, and no Chromium is installed (apt-get install chromium)"
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    url = page.resolve().as_uri()
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
    shot = page.with_suffix(".png") if screenshot else None
    if shot is not None:
        subprocess.run(flags + ["--window-size=1280,1800", f"--screenshot={shot}", url], capture_output=True, timeout=180)
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    return dom.stdout, console, shot


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(chromium() is None and not os.environ.get("PRECLINT_REQUIRE_BROWSER"),
                    reason="headless Chromium (Debian: apt-get install chromium) opens the page")
def test_the_page_opens_in_a_browser_without_errors_and_draws_its_charts(net, tmp_path, capsys):
    assert main(["check", "net.py", *ARGS, "--output-format", "html", "-o", "small.html"]) == 1
    (net / "large.html").write_text(render(large_report(), "html"))
    for name, charts in (("small.html", 3), ("large.html", 3)):
        dom, console, shot = open_in_browser(net / name, tmp_path, screenshot=name == "small.html")
        assert console == [], (name, console)
        assert f'data-charts="{charts}"' in dom, name  # the script ran to its end
        # plotly drew every chart: each chart's div holds its SVG
        assert len(re.findall(r'class="[^"]*js-plotly-plot', dom)) == charts, name
        assert dom.count('class="main-svg"') >= charts, name
        assert shot is None or (shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000)
    # 6000 nodes: modules aggregated, so the chart shows a readable number of items
    shown = re.search(r"(\d+) shown \((\d+) modules aggregated\) of 6000 nodes", dom)
    assert shown and 1 < int(shown.group(1)) <= 160 and int(shown.group(2)) > 0


CLICK = """<script>
// what a reader does: click the first module on the chart along the model, then a finding's link
const along = document.querySelector(".chart.tall"), controls = document.querySelector(".controls");
const before = controls.querySelector(".help").textContent;
along.emit("plotly_click", {points: [{x: 0, data: {name: "local, predicted"}}]});
const expanded = controls.querySelector(".help").textContent;
[...controls.querySelectorAll("button")].find(b => b.textContent === "collapse the last expanded").click();
const collapsed = controls.querySelector(".help").textContent;
document.querySelector("a.show-node").click();
document.body.dataset.clicks = JSON.stringify([before, expanded, collapsed, controls.querySelector("select").value]);
</script>"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(chromium() is None and not os.environ.get("PRECLINT_REQUIRE_BROWSER"),
                    reason="headless Chromium (Debian: apt-get install chromium) opens the page")
def test_a_click_expands_a_module_and_a_finding_shows_its_node(tmp_path):
    page = tmp_path / "clicks.html"
    page.write_text(render(large_report(), "html").replace("</body>", CLICK + "</body>"))
    dom, console, _ = open_in_browser(page, tmp_path, screenshot=False)
    assert console == []
    before, expanded, collapsed, mode = json.loads(html.unescape(re.search(r'data-clicks="([^"]*)"', dom).group(1)))
    count = lambda text: int(text.split()[0])  # noqa: E731
    assert count(expanded) > count(before)  # the module opened into its parts
    assert collapsed == before  # and closed again
    assert mode == "fp16"  # the finding's precision, with its node shown
