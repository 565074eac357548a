"""The output formats are the modules of preclint/report/formats/: each declares what the command line,
the configuration and the docs list of it, and a module added there is a format everywhere, with no
other edit."""
from __future__ import annotations

import pkgutil

import pytest

import preclint.report.formats as formats_package
from preclint.cli import main
from preclint.config import Config
from preclint.core.errors import UserError
from preclint.report import FORMATS, Report, render
from preclint.report.formats import DECLARED, document_formats, format_named, formats, help_text, names


def test_every_format_module_declares_what_the_listings_read():
    modules = [info.name for info in pkgutil.iter_modules(formats_package.__path__) if not info.name.startswith("_")]
    assert sorted(modules) == sorted(names()) == sorted(FORMATS)
    orders = [module.ORDER for module in formats().values()]
    assert len(set(orders)) == len(orders), "two formats at one place in the listings"
    for name, module in formats().items():
        missing = [attr for attr in DECLARED if not hasattr(module, attr)]
        assert not missing, f"{name} lacks {missing}"
        assert module.NAME == module.__name__.rsplit(".", 1)[1]
        assert module.LABEL.split(" ")[0] == name and module.SUMMARY and isinstance(module.DOCUMENT, bool)


def test_the_listings_are_those_of_before():
    assert names() == ("full", "concise", "json", "sarif", "github", "rdjson", "gitlab", "junit", "html")
    assert help_text() == ("full (default), concise, json, sarif, github, rdjson (reviewdog), gitlab (Code Quality), "
                           "junit, html (a page for the browser: use --output)")
    assert document_formats() == {"json", "sarif", "rdjson", "gitlab", "junit", "html"}
    with pytest.raises(ValueError):
        format_named("xml")


@pytest.fixture
def added_format(tmp_path, monkeypatch):
    """A format module ``tally`` (one line: how many findings) in a folder on the package's path."""
    (tmp_path / "tally.py").write_text(
        'NAME = "tally"\nLABEL = "tally (a count)"\nSUMMARY = "How many findings"\nDOCUMENT = False\nORDER = 95\n\n\n'
        "def render_many(reports, *, color=False):\n"
        "    return f\"{sum(len(r.findings) for r in reports)} findings\\n\"\n")
    monkeypatch.setattr(formats_package, "__path__", formats_package.__path__ + [str(tmp_path)])
    formats_package._discovered.cache_clear()
    yield
    formats_package._discovered.cache_clear()


def test_a_module_added_to_the_package_is_a_format_everywhere(added_format, tmp_path, monkeypatch, capsys):
    assert names()[-1] == "tally" and help_text().endswith(", tally (a count)")
    assert render(Report(), "tally") == "0 findings\n"
    Config(output_format="tally").validate("pyproject.toml")  # the configuration takes it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text("import torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    main(["check", "--source-only", "m.py", "--output-format", "tally", "--exit-zero"])
    assert capsys.readouterr().out == "1 findings\n"


def test_the_configuration_names_the_formats_it_takes():
    with pytest.raises(UserError, match="output-format must be one of full, concise, json, .*, html, not 'xml'"):
        Config(output_format="xml").validate("pyproject.toml")
