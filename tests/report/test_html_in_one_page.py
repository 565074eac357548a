"""Several HTML reports in one document, as a Jupyter notebook holds them (each output's HTML put into
the same page, its scripts run in order): every report's ids, style rules and script are its own, so
no report draws into another, and a report shown twice draws each copy once."""
from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from html.parser import HTMLParser

import pytest

from preclint.report import render
from preclint.report.html import PlanSection, render_many
from preclint.report.watch_html import render as render_watch
from tests.report.test_html_report import chromium, large_report, open_in_browser

PREFIX = re.compile(r"preclint-[0-9a-f]{12}")


def decoder_report():
    """Another model's report: other module names, a fifty times larger output error."""
    report = large_report(40)
    rename = lambda rows: [{**row, "module": row["module"].replace("encoder", "decoder")} for row in rows]  # noqa: E731
    summary = {m: {"predicted_output": {"rel_error": 5e-2, "max_abs_error": 1.0, "finite": True}}
               for m in report.precisions}
    return dataclasses.replace(report, model="model.py:Decoder", profile=rename(report.profile),
                               ledger=rename(report.ledger), summary=summary, findings=[])


def watch_records():
    return [{"step": step, "totals": {"underflow_fraction": 0.1 * step, "zero_gradient_fraction": 0.0,
                                      "lost_update_fraction": 0.01},
             "layers": {"fc": {"underflow_fraction": 0.2, "lost_update_fraction": 0.02}}} for step in (1, 2, 3)]


def pages():
    """(name, page): the check's report of two models, a plan's page and a watched run's charts."""
    plan = PlanSection("Keep 1 layer in float32.", ["layer"], [["fc1"]],
                       {"x": ["none", "fc1"], "series": {"fp16": [1e-2, 1e-4]}, "y_title": "rel. error", "log": True})
    return [("encoder", render(large_report(30), "html")), ("decoder", render(decoder_report(), "html")),
            ("plan", render_many([large_report(20)], plan=plan)), ("watch", render_watch(watch_records()))]


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.styles, self.scripts, self._in = [], [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        self._in = (tag, attrs.get("type")) if tag in ("style", "script") else None

    def handle_data(self, data):
        if self._in == ("style", None):
            self.styles.append(data)
        elif self._in == ("script", None) and not data.lstrip().startswith("/**"):  # not plotly.js itself
            self.scripts.append(data)

    def handle_endtag(self, tag):
        self._in = None


def parsed(page: str) -> _Ids:
    parser = _Ids()
    parser.feed(page)
    parser.close()
    return parser


def test_each_page_has_its_own_ids_styles_and_script():
    seen = {}
    for name, page in pages():
        found = parsed(page)
        prefixes = set(PREFIX.findall(page))
        assert len(prefixes) == 1, (name, prefixes)  # one prefix a page, in everything it names
        (prefix,) = prefixes
        assert found.ids[0] == prefix and all(i == prefix or i.startswith(prefix + "-") for i in found.ids), name
        for other, ids in seen.items():
            assert not set(ids) & set(found.ids), (name, other)
        seen[name] = found.ids
        # every style rule applies inside the page's root only, never to the document around it
        rules = [rule for css in found.styles for rule in css.split("}") if rule.strip()]
        assert all(s.strip().startswith("#" + prefix) for rule in rules for s in rule.split("{")[0].split(",")), name
        # the script is called with its own root, and finds no element but by that root's id
        (script,) = found.scripts
        assert script.rstrip().rstrip(";").endswith(")") and f'"{prefix}"' in script, name
        assert not re.search(r"getElementById|document\.querySelector\((?!.*rootId)", script), name
    assert seen["encoder"] != seen["decoder"]  # two models, two prefixes
    # the same report renders to the same bytes (the command line's file and the API's page agree)
    assert render(large_report(30), "html") == pages()[0][1]


PROBE = """<script>
// what each notebook output shows: its root, its charts, the bars of its output chart, the modules along
// its model, its controls
document.body.dataset.probe = JSON.stringify([...document.querySelectorAll("div.output")].map(output => {
  const root = output.querySelector("[id]"), outputs = output.querySelector(".chart.small"),
        along = output.querySelector(".chart.tall");
  return {id: root ? root.id : null, drawn: root ? root.dataset.drawn || null : null, plots: output.querySelectorAll(".js-plotly-plot").length,
          selects: output.querySelectorAll(".controls select").length,
          outputs: outputs && outputs.data ? outputs.data[0].x : null,
          labels: along && along.data ? [...new Set(along.data[0].text)] : null};
}));
</script>"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(chromium() is None and not os.environ.get("PRECLINT_REQUIRE_BROWSER"),
                    reason="headless Chromium (Debian: apt-get install chromium) opens the page")
def test_reports_in_one_notebook_page_draw_only_into_themselves(tmp_path):
    rendered = pages()
    # as a notebook holds them: one output after another, and the first report shown a second time
    outputs = [page for _, page in rendered] + [rendered[0][1]]
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><body>" + "\n".join(f"<div class='output'>{page}</div>" for page in outputs)
                        + PROBE + "</body></html>")
    dom, console, _ = open_in_browser(notebook, tmp_path, screenshot=False)
    assert console == []
    roots = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    encoder, decoder, plan, watch, again = roots
    assert [r["id"] for r in roots] == [PREFIX.search(page).group(0) for page in outputs]
    assert all(r["drawn"] == "1" for r in roots)
    for root in (encoder, decoder, again):  # outputs, along the model, top contributors; one set of controls
        assert root["plots"] == 3 and root["selects"] == 1, root
    assert plan["plots"] == 4 and plan["selects"] == 1  # and the plan's chart
    assert watch["plots"] == 3 and watch["selects"] == 0
    # each output chart holds its own report's bars, and each chart along the model its own modules
    assert encoder["outputs"] == again["outputs"] == [1e-3] * 3 and decoder["outputs"] == [5e-2] * 3
    assert all("decoder" not in label for label in encoder["labels"] + again["labels"] + plan["labels"])
    assert all("encoder" not in label for label in decoder["labels"])
