"""What users name (files, modules) reaches every output escaped for it: nothing a file name or a
module name holds can become a GitHub workflow command, move a terminal, be read as rich markup,
become a link in the HTML page, or break a SARIF URI or a JSON document; the findings keep the raw
names, and the JSON formats carry them as they are."""
from __future__ import annotations

import json
import os
import re
import sys
import unicodedata
from urllib.parse import unquote, urlsplit
from xml.etree import ElementTree

import jsonschema
import pytest
import xmlschema

from preclint.cli import main
from preclint.report import FORMATS
from preclint.report.escape import chart_label, diff_path, file_uri, log_line, visible
from tests.report.test_html_report import chromium, open_in_browser
from tests.paths import DATA

AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"
TEXT_FORMATS = ("full", "concise", "github")
SARIF_SCHEMA = DATA / "sarif-schema-2.1.0.json"
GITLAB_SCHEMA = DATA / "gitlab-codequality.schema.json"
JUNIT_SCHEMA = DATA / "junit-10.xsd"
# preclint's own annotations: a level, escaped properties (no raw ':' or ','), then the message
OWN_ANNOTATION = re.compile(r"::(error|warning|notice) (file=[^:,]*,line=\d+,col=\d+,)?title=preclint( \(PCL\d{3}\))?::")
HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}

# a checked file's name: a line break and a command after it, a title-changing escape sequence and a
# right-to-left override
HOSTILE_FILE = "bad\n::error file=x::owned\n::stop-commands::tok\x1b]0;title\x07\u202e.py"
SHOWN = "bad\\n::error file=x::owned\\n::stop-commands::tok\\x1b]0;title\\x07\\u202e.py"  # as preclint shows it
LEADING_FILE = "::error file=x::owned.py"  # a whole line that reads as a command unless escaped
OLD_STYLE_FILE = "v1 ##[error]owned.py"  # the runner's older syntax, read anywhere in a line
NOT_UTF8_FILE = os.fsdecode(b"\xff-latin1.py")  # a name that is not UTF-8: a lone surrogate in Python


def hidden_characters(text: str) -> list:
    return sorted({c for c in text if c != "\n" and unicodedata.category(c) in HIDDEN})


def assert_safe_for_a_terminal_and_a_runner(text: str, fmt: str) -> None:
    """No line a runner reads as a command (other than preclint's own, well-formed annotations in the
    github format, which the runner reads first and whole), no control or bidi character, no escape
    sequence."""
    assert hidden_characters(text) == [], (fmt, hidden_characters(text))
    for line in text.split("\n"):
        if line.lstrip().startswith("::"):
            assert fmt == "github" and OWN_ANNOTATION.match(line), (fmt, line)
        else:
            assert "##[" not in line, (fmt, line)


@pytest.fixture
def hostile_files(tmp_path, monkeypatch):
    """A project whose file names are hostile, as the working directory, with its own cache. The
    first file has 12 findings: in the github format, the last ones are plain log lines (GitHub keeps
    10 annotations a level)."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (project / HOSTILE_FILE).write_text("import torch\n" + "".join(
        f"\nwith torch.cuda.amp.autocast():\n    y{i} = model(x)\n" for i in range(12)))
    for name in (LEADING_FILE, OLD_STYLE_FILE):
        (project / name).write_text(AMP)
    return project


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_source_check_of_hostile_file_names_is_escaped_in_every_format(hostile_files, capsys, fmt):
    args = ["check", "--source-only", ".", "--output-format", fmt]
    code = main(args + (["--output", "report.html"] if fmt == "html" else []))
    out, err = capsys.readouterr()
    assert code == 1, err  # findings, and no crash on any name
    assert_safe_for_a_terminal_and_a_runner(err, "stderr")
    paths = {HOSTILE_FILE, LEADING_FILE, OLD_STYLE_FILE}
    if fmt in TEXT_FORMATS:
        assert_safe_for_a_terminal_and_a_runner(out, fmt)
        # each name shown literally, its hidden characters as escapes (in the github format, the
        # last findings are plain log lines)
        assert f"\n{SHOWN}:36:6: PCL502" in out if fmt != "full" else f"\n{SHOWN}\n" in out
        assert "v1 ##\\x5berror]owned.py" in out
        if fmt != "github":  # (there, it is an annotation's: the line starts with preclint's "::warning")
            assert "\\x3a:error file=x::owned.py" in out
    elif fmt == "json":
        assert {f["location"]["path"] for f in json.loads(out)["findings"]} == paths  # the raw names
    elif fmt == "rdjson":
        assert {d["location"]["path"] for d in json.loads(out)["diagnostics"]} == paths
    elif fmt == "gitlab":
        issues = json.loads(out)
        jsonschema.validate(issues, json.loads(GITLAB_SCHEMA.read_text()))
        assert {i["location"]["path"] for i in issues} == paths  # the raw names
    elif fmt == "junit":
        assert_safe_for_a_terminal_and_a_runner(out, fmt)  # shown as a CI page shows it: escapes
        xmlschema.XMLSchema(str(JUNIT_SCHEMA)).validate(out)
        names = {case.get("name") for case in ElementTree.fromstring(out).iter("testcase")}
        assert names == {SHOWN, "v1 ##\\x5berror]owned.py", "\\x3a:error file=x::owned.py"}
    elif fmt == "sarif":
        document = json.loads(out)
        jsonschema.validate(document, json.loads(SARIF_SCHEMA.read_text()))
        uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in document["runs"][0]["results"]]
        for uri in uris:  # RFC 3986: only unreserved characters, '/' and percent escapes; no scheme
            assert re.fullmatch(r"[A-Za-z0-9\-._~/]*(%[0-9A-F]{2}[A-Za-z0-9\-._~/]*)*", uri), uri
            assert urlsplit(uri).scheme == "" and urlsplit(uri).path == uri
        assert {unquote(uri, errors="surrogateescape") for uri in uris} == paths  # they round-trip
    else:
        page = (hostile_files / "report.html").read_text(encoding="utf-8")
        assert SHOWN in page
        body = page.split("</head>", 1)[1]  # (the inlined plotly.js holds control characters of its own)
        assert hidden_characters(body.replace("\t", "")) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_name_that_is_not_utf8_is_shown_in_every_format(hostile_files, capsys, fmt):
    (hostile_files / NOT_UTF8_FILE).write_text(AMP)
    code = main(["check", "--source-only", NOT_UTF8_FILE, "--output-format", fmt, "--output", "report"])
    out, err = capsys.readouterr()
    assert code == 1, err  # not "internal error: UnicodeEncodeError"
    written = (hostile_files / "report").read_text(encoding="utf-8")  # strict UTF-8
    if fmt in ("full", "concise", "github", "html", "junit"):
        assert "\\xff-latin1.py" in written  # the byte, shown
    elif fmt == "sarif":
        assert '"uri": "%FF-latin1.py"' in written  # its URI: the byte, percent-encoded
    else:  # json, rdjson, gitlab: the raw name, as JSON writes a lone surrogate
        assert json.loads(written) and '"path": "\\udcff-latin1.py"' in written


def test_a_diff_quotes_a_hostile_file_name_as_git_does(hostile_files, capsys):
    (hostile_files / NOT_UTF8_FILE).write_text(AMP)
    code = main(["check", "--source-only", ".", "--diff"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert_safe_for_a_terminal_and_a_runner(out, "diff")
    assert '--- "a/bad\\n::error file=x::owned\\n::stop-commands::tok\\033]0;title\\a\\342\\200\\256.py"\n' in out
    assert '+++ "b/\\377-latin1.py"\n' in out and "+++ b/::error file=x::owned.py\n" in out
    assert "\n+with torch.autocast(\"cuda\", dtype=torch.float16):\n" in out


def test_stderr_lines_show_a_hostile_name_escaped(hostile_files, capsys):
    missing = "gone\n::error file=x::owned.py"
    assert main(["check", "--source-only", missing]) == 2
    err = capsys.readouterr().err
    assert_safe_for_a_terminal_and_a_runner(err, "stderr")
    assert err.count("\n") == 1 and "gone\\n::error file=x::owned.py" in err


# ---- a model whose module names are hostile ------------------------------------------------------

MODULE_NAMES = ["a\n::stop-commands::x", "[/]", "[md](https://example)", "t\x1b]0;title\x07",
                '<a href="https://example">x</a>']  # (a module name cannot hold a ".")
MODEL = f"""\
import torch
import torch.nn as nn


class Overflow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)
        nn.init.constant_(self.fc.weight, 3e4)

    def forward(self, x):
        return self.fc(x) / 1.2e5  # the product is above float16's range


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({{name: Overflow() for name in {MODULE_NAMES!r}}})

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x


model = Net()
example_inputs = (torch.ones(2, 4),)
"""


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    """Every format's output of one check of the model, {format: (exit code, stdout, stderr)}, the
    HTML page ("page") and the output of ``preclint plan`` ("plan")."""
    directory = tmp_path_factory.mktemp("model")
    (directory / "hostile.py").write_text(MODEL)
    cwd = os.getcwd()
    os.chdir(directory)
    outputs = {}
    try:
        for fmt in FORMATS:
            capture = _Capture()
            with capture:
                extra = ["--output", "report.html"] if fmt == "html" else []
                code = main(["check", "hostile.py", "--precision", "fp16", "--output-format", fmt, *extra])
            outputs[fmt] = (code, capture.out.getvalue(), capture.err.getvalue())
        outputs["page"] = (directory / "report.html").read_text(encoding="utf-8")
        capture = _Capture()
        with capture:
            code = main(["plan", "hostile.py", "--precision", "fp16", "--rtol", "1e-2", "--atol", "1e-2", "--no-verify"])
        outputs["plan"] = (code, capture.out.getvalue(), capture.err.getvalue())
    finally:
        os.chdir(cwd)
    return outputs


class _Capture:
    """stdout and stderr of the block, as strict UTF-8 text (as a terminal or a CI log takes them)."""

    def __enter__(self):
        import io

        self.out, self.err = io.StringIO(), io.StringIO()
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.out, self.err

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self.saved


@pytest.mark.slow
def test_the_full_report_shows_hostile_module_names_literally(hostile_model):
    code, out, err = hostile_model["full"]
    assert code == 1, err  # the findings, not "internal error: MarkupError"
    assert_safe_for_a_terminal_and_a_runner(out, "full")
    assert_safe_for_a_terminal_and_a_runner(err, "stderr")
    words = " ".join(out.split())  # (rich wraps long lines at spaces)
    for name in MODULE_NAMES:  # every name printed as it is, none eaten as markup, in the summary table too
        assert f"PCL101 [error] layers.{visible(name)}.fc overflows float16" in words, name
        assert f"keep layers.{visible(name)}.fc in float32" in words, name
    assert "layers.[md](https://example).fc" in out and "layers.[/].fc" in out
    assert "layers.a\\n::stop-commands::x.fc" in out and "layers.t\\x1b]0;title\\x07.fc" in out


@pytest.mark.slow
def test_the_plan_shows_hostile_module_names_literally(hostile_model):
    code, out, err = hostile_model["plan"]
    assert code == 0, err  # the plan, not "internal error: MarkupError"
    assert_safe_for_a_terminal_and_a_runner(out, "plan")
    table = [line.split("\u2502")[0].strip() for line in out.splitlines()]  # the module column
    assert {f"layers.{visible(name)}.fc" for name in MODULE_NAMES} <= set(table), out


@pytest.mark.parametrize("fmt", ["concise", "github"])
def test_the_terse_formats_escape_hostile_module_names(hostile_model, fmt):
    code, out, err = hostile_model[fmt]
    assert code == 1, err
    assert_safe_for_a_terminal_and_a_runner(out, fmt)
    assert out.count(": PCL101 layers.") == len(MODULE_NAMES)
    assert "layers.a\\n::stop-commands::x.fc" in out


def test_junit_shows_hostile_module_names_with_escapes(hostile_model):
    code, out, err = hostile_model["junit"]
    assert code == 1, err
    assert_safe_for_a_terminal_and_a_runner(out, "junit")
    xmlschema.XMLSchema(str(JUNIT_SCHEMA)).validate(out)
    messages = [f.get("message") for f in ElementTree.fromstring(out).iter("failure")]
    for name in MODULE_NAMES:
        assert any(m.startswith(f"PCL101 layers.{visible(name)}.fc overflows") for m in messages), name


@pytest.mark.parametrize("fmt", ["json", "rdjson", "sarif", "gitlab"])
def test_the_json_formats_carry_the_raw_module_names(hostile_model, fmt):
    code, out, err = hostile_model[fmt]
    assert code == 1, err
    for name in MODULE_NAMES:
        assert json.dumps(f"layers.{name}.fc")[1:-1] in out, name  # the raw name, as JSON writes it


def test_the_html_page_shows_hostile_module_names_as_text(hostile_model):
    code, out, err = hostile_model["html"]
    assert code == 1, err
    page = hostile_model["page"]
    assert '<a href="https://example' not in page and '<a href=\\"https://example' not in page  # no link from a name
    assert "layers.&lt;a href=&quot;https://example&quot;&gt;x&lt;/a&gt;.fc" in page  # the finding card
    (data,) = [json.loads(block.replace("<\\/", "</")) for block in
               re.findall(r"<script type='application/json' class='report-data'>(.*?)</script>", page, re.S)]
    # the chart labels, which plotly renders as HTML: entities, which it shows as the characters
    assert 'layers.&lt;a href="https://example"&gt;x&lt;/a&gt;.fc' in data["nodes"]["labels"]
    assert not any("<" in label for label in data["nodes"]["labels"] + data["nodes"]["modules"])


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None and not os.environ.get("PRECLINT_REQUIRE_BROWSER"),
                    reason="headless Chromium (Debian: apt-get install chromium) opens the page")
def test_the_charts_draw_a_hostile_module_name_as_text_not_as_a_link(hostile_model, tmp_path):
    page = tmp_path / "hostile.html"
    page.write_text(hostile_model["page"], encoding="utf-8")
    dom, console, _ = open_in_browser(page, tmp_path, screenshot=False)
    assert console == [] and dom.count('class="main-svg"') >= 3  # the charts were drawn
    assert 'xlink:href="https://example"' not in dom  # plotly made no link of the name
    assert '>layers.&lt;a href="https://example"&gt;x&lt;/a&gt;.fc</text>' in dom  # a label, shown as text


def test_a_name_the_full_report_wraps_onto_a_line_of_its_own_does_not_start_a_command():
    from preclint.core.findings import Finding, Location
    from preclint.report import Report, render

    name = "x" * 90 + " ::stop-commands::tok"  # rich wraps at the space: the command would begin a line
    finding = Finding("PCL101", "fp16-overflow", "error", f"{name} overflows float16.", "Scale it.",
                      location=Location("m.py", 1, 1))
    out = render(Report(findings=[finding]), "full")
    assert_safe_for_a_terminal_and_a_runner(out, "full")
    assert "\n\\x3a:stop-commands::tok overflows float16.\n" in out


def test_the_escapes_one_by_one():
    assert visible("a\n\x1b[31m\u202e\udcff\U000e0041ok") == "a\\n\\x1b[31m\\u202e\\xff\\U000e0041ok"
    assert visible("é, 中文, tab\t", keep="\t") == "é, 中文, tab\t"
    assert log_line("  ::error::x") == "  \\x3a:error::x" and log_line("\u00a0::x") == "\u00a0\\x3a:x"
    assert log_line("see ##[error]x") == "see ##\\x5berror]x" and log_line("a::b") == "a::b"
    assert chart_label('<a href="u">&lt;</a>') == '&lt;a href="u"&gt;&amp;lt;&lt;/a&gt;'
    assert file_uri("a b/c:d/é%.py") == "a%20b/c%3Ad/%C3%A9%25.py"
    assert diff_path("a/x.py") == "a/x.py" and diff_path('a/"\\.py') == '"a/\\"\\\\.py"'
