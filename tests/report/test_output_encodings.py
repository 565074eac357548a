"""Every output format survives any file or module name and any stdout encoding: a stdout that is not
UTF-8 (cp1252, what Windows gives a redirected stdout; ASCII, a C locale) takes the console formats with
what it cannot hold written as escapes, and the documents (JSON, SARIF, GitLab, rdjson, JUnit, HTML) as
the UTF-8 they are; a module name with a lone surrogate is a name like any other, in every format, in
the fingerprints and in a baseline."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from xml.etree import ElementTree

import jsonschema
import pytest

from preclint.cli import main
from preclint.report import FORMATS
from preclint.report.output import DOCUMENT_FORMATS, write_report
from tests.paths import DATA, ROOT

TF32_AT_IMPORT = "import torch\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
NAMES = ("模型.py", "net_😀.py", "café.py")  # CJK, beyond the BMP, and one cp1252 holds
GITLAB_SCHEMA = json.loads((DATA / "gitlab-codequality.schema.json").read_text())
SARIF_SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture
def named_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    for name in NAMES:
        (tmp_path / name).write_text(TF32_AT_IMPORT, encoding="utf-8")
    return tmp_path


def _stdout(encoding: str) -> io.TextIOWrapper:
    """A stdout as Python makes one for a redirected stream in ``encoding`` (strict, as stdout is)."""
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict", write_through=False)


def _assert_valid(fmt: str, data: bytes) -> None:
    if fmt in DOCUMENT_FORMATS:
        text = data.decode("utf-8")  # strict: the documents are UTF-8 whatever the stream's encoding
        if fmt == "junit":
            ElementTree.fromstring(data)
        elif fmt == "html":
            assert "模型.py" in text and "net_😀.py" in text
        else:
            document = json.loads(text)
            if fmt == "gitlab":
                jsonschema.validate(document, GITLAB_SCHEMA)
            if fmt == "sarif":
                jsonschema.validate(document, SARIF_SCHEMA)
        if fmt in ("json", "rdjson", "gitlab"):  # the raw names, as JSON carries them
            assert all(name in json.dumps(json.loads(text), ensure_ascii=False) for name in NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_prints_any_file_name_on_a_stdout_that_is_not_utf8(named_project, monkeypatch, capsys, fmt,
                                                                         encoding):
    stdout = _stdout(encoding)
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(["check", "--source-only", ".", "--output-format", fmt])
    stdout.flush()
    err = capsys.readouterr().err
    assert code == 1, err  # the findings, not "internal error: UnicodeEncodeError"
    data = stdout.buffer.getvalue()
    _assert_valid(fmt, data)
    if fmt not in DOCUMENT_FORMATS:
        text = data.decode(encoding)  # what the stream holds, and nothing it could not
        assert "\\u6a21\\u578b.py" in text and "net_\\U0001f600.py" in text
        if encoding == "cp1252":
            assert "café.py" in text  # what the stream can hold stays as it is


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_redirected_cp1252_stdout_takes_the_report_of_a_cjk_file_name(named_project):
    """As Windows runs it: `preclint check --source-only . > report.txt` (PYTHONIOENCODING reproduces
    the locale's encoding)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="cp1252")
    for fmt in ("concise", "gitlab"):
        proc = subprocess.run([sys.executable, "-m", "preclint", "check", "--source-only", ".", "--output-format", fmt],
                              cwd=named_project, env=env, capture_output=True, timeout=120)
        assert proc.returncode == 1 and b"internal error" not in proc.stderr, proc.stderr
        _assert_valid(fmt, proc.stdout)
        if fmt == "concise":
            assert b"\\u6a21\\u578b.py:3:1: PCL504" in proc.stdout


def test_a_stream_of_text_alone_takes_the_report_as_it_is():
    out = io.StringIO()
    write_report("模型 \ud800\n", out, fmt="full")  # (an in-memory stream holds any string)
    assert out.getvalue() == "模型 \ud800\n"


@pytest.mark.parametrize("fmt", ["json", "full"])
def test_a_stream_without_bytes_beneath_gets_escapes_that_keep_a_document_valid(fmt):
    class NarrowText(io.StringIO):
        encoding = "ascii"

    out = NarrowText()
    write_report('{"path": "模型_😀 é"}\n', out, fmt=fmt)
    if fmt == "json":  # JSON's own escapes: the same document
        assert json.loads(out.getvalue()) == {"path": "模型_😀 é"}
    else:
        assert out.getvalue() == '{"path": "\\u6a21\\u578b_\\U0001f600 \\xe9"}\n'


SURROGATE_MODULE = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module("a\\ud800b", nn.Linear(8, 8))  # a name no file system gives: a lone surrogate

        def forward(self, x):
            return getattr(self, "a\\ud800b")(x * 1e5) * 1e4  # overflows float16: a finding on the module

    example_inputs = (torch.randn(2, 8),)
"""


@pytest.mark.slow
def test_a_module_name_with_a_lone_surrogate_survives_every_format_and_the_baseline(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(SURROGATE_MODULE))
    for fmt in FORMATS:
        code = main(["check", "net.py", "--output-format", fmt, "--output", f"report.{fmt}", "-q", "--select", "PCL101"])
        err = capsys.readouterr().err
        assert code == 1, (fmt, err)  # the finding, not "internal error: UnicodeEncodeError"
        data = (tmp_path / f"report.{fmt}").read_bytes()
        data.decode("utf-8")  # strict
        if fmt in ("json", "sarif", "rdjson", "gitlab"):  # valid JSON, with the raw name in it
            assert "a\ud800b" in json.dumps(json.loads(data), ensure_ascii=False)
    assert main(["check", "net.py", "--write-baseline", "baseline.json", "-q", "--select", "PCL101"]) == 0
    capsys.readouterr()
    records = json.loads((tmp_path / "baseline.json").read_text(encoding="utf-8"))["findings"]
    assert [r["code"] for r in records] == ["PCL101"]
    # the baseline reads back and knows the finding
    assert main(["check", "net.py", "--baseline", "baseline.json", "-q", "--select", "PCL101",
                 "--output-format", "concise"]) == 0
    assert capsys.readouterr().out == "All checks passed!\n"


TWO_FAILING_MODELS = """
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            raise RuntimeError("no encoder today")

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            raise RuntimeError("no decoder today")
"""


@pytest.mark.slow
def test_two_models_of_one_file_that_fail_are_two_gitlab_issues(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(TWO_FAILING_MODELS))

    def fingerprints(*models):
        assert main(["check", *models, "--output-format", "gitlab", "-q"]) == 2
        issues = json.loads(capsys.readouterr().out)
        jsonschema.validate(issues, GITLAB_SCHEMA)
        by_model: dict = {}
        for issue in issues:  # "preclint could not check net.py:Encoder: ...", the first of each model
            by_model.setdefault(issue["description"].split()[4].rstrip(":"), issue["fingerprint"])
        return by_model, [i["fingerprint"] for i in issues]

    first, every = fingerprints("net.py:Encoder", "net.py:Decoder", "net.py:Decoder")
    assert len(every) == 3 and len(set(every)) == 3  # unique, as GitLab shows one issue per fingerprint
    again, _ = fingerprints("net.py:Decoder", "net.py:Encoder")
    assert again == first and len(set(first.values())) == 2  # stable, in any order


def test_a_diff_on_a_cp1252_stdout_is_the_utf8_patch_git_applies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "模型.py").write_text("import torch\n\n# 注释\nwith torch.cuda.amp.autocast():\n    y = 1\n",
                                      encoding="utf-8")
    stdout = _stdout("cp1252")
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["check", "--source-only", "--diff", "--unsafe-fixes", "模型.py"]) == 1, capsys.readouterr().err
    stdout.flush()
    patch = stdout.buffer.getvalue().decode("utf-8")  # strict: the files' own text, as git writes a patch
    assert patch.startswith("--- a/模型.py\n+++ b/模型.py\n") and "\n # 注释\n" in patch
