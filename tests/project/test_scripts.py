"""The scripts that keep the rule pack's surroundings in step with it: the rule pages and their index
are the ones the rule classes generate, and a scaffolded rule is found by the pack and passes its own
generated example tests."""
from __future__ import annotations

import importlib.util
import sys

import pytest

import preclint.rules
from preclint.rules.base import markdown_table
from preclint.rules import all_rules
from tests.rules.test_rule_examples import assert_example
from tests.paths import ROOT

SCRIPTS = ROOT / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"preclint_scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rule_index_lists_every_rule_with_a_link_to_its_page():
    rule_table = _script("rule_table")
    text = (rule_table.RULE_PAGES / "README.md").read_text(encoding="utf-8")
    for code, rule in all_rules().items():
        assert f"| [{code}]({code}.md) | {rule.name} |" in text


def test_every_rule_has_its_generated_page():
    rule_table = _script("rule_table")
    assert rule_table.stale_pages() == [], "run python scripts/rule_table.py"
    for code, rule in all_rules().items():
        page = (rule_table.RULE_PAGES / f"{code}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {code} {rule.name}\n") and "## Why it matters" in page and "## Fix" in page


def test_the_output_formats_page_is_generated_from_the_format_modules():
    from preclint.report import FORMATS

    rule_table = _script("rule_table")
    page = rule_table.FORMATS_PAGE.read_text(encoding="utf-8")
    assert page == rule_table.formats_page(), "run python scripts/rule_table.py"
    assert [line.split("`")[1] for line in page.splitlines() if line.startswith("| `")] == list(FORMATS)


def test_a_changed_rule_makes_its_page_stale(monkeypatch):
    rule_table = _script("rule_table")
    rule = all_rules()["PCL101"]
    monkeypatch.setattr(rule, "fix", rule.fix + " And one more thing.")
    assert rule_table.stale_pages() == ["PCL101.md"]


@pytest.fixture
def scratch_pack(tmp_path, monkeypatch):
    """A directory the rule pack also walks (``model/`` and ``source/`` in it), for rules scaffolded
    during a test."""
    for kind in preclint.rules.KINDS:
        package = importlib.import_module(f"preclint.rules.{kind}")
        (tmp_path / kind).mkdir()
        monkeypatch.setattr(package, "__path__", list(package.__path__) + [str(tmp_path / kind)])
    preclint.rules.rediscover()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("preclint.rules."):
            del sys.modules[name]
    monkeypatch.undo()
    preclint.rules.rediscover()


def test_a_scaffolded_graph_rule_is_discovered_and_its_examples_pass(scratch_pack):
    new_rule = _script("new_rule")
    path = new_rule.scaffold("PCL298", "scaffolded-check", "A scaffolded rule.", directory=scratch_pack / "model")
    assert path.name == "scaffolded_check.py"
    rule = all_rules()["PCL298"]
    assert rule.why.strip() and rule.example.strip() and rule.fix.strip()
    assert rule.bad and rule.good
    for kind, examples in (("bad", rule.bad), ("good", rule.good)):
        for example in examples:
            assert_example(rule, kind, example)
    assert "| PCL298 | scaffolded-check | model |" in markdown_table(list(all_rules().values()))


def test_a_scaffolded_source_rule_is_discovered_and_its_snippets_pass(scratch_pack):
    from preclint.source.run import check_text

    new_rule = _script("new_rule")
    new_rule.scaffold("PCL598", "scaffolded-source", "A scaffolded source rule.", directory=scratch_pack / "source",
                      source=True, api="torch.testing.assert_allclose")
    rule = all_rules()["PCL598"]
    for snippet in rule.invalid:
        assert "PCL598" in [f.code for f in check_text(snippet, "pkg/module.py")]
    for snippet in rule.valid:
        assert "PCL598" not in [f.code for f in check_text(snippet, "pkg/module.py")]


def test_the_scaffold_refuses_a_taken_code_or_name(tmp_path):
    new_rule = _script("new_rule")
    with pytest.raises(ValueError, match="never reused"):
        new_rule.scaffold("PCL101", "another-name", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="already named"):
        new_rule.scaffold("PCL297", "fp16-overflow", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="kebab-case"):
        new_rule.scaffold("PCL297", "Bad Name", "A summary.", directory=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.fixture
def scratch_analyses(tmp_path, monkeypatch):
    """A directory the analyses' package also walks, for statistics scaffolded during a test."""
    import preclint.reference.analyses as analyses

    monkeypatch.setattr(analyses, "__path__", list(analyses.__path__) + [str(tmp_path)])
    analyses.rediscover()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("preclint.reference.analyses."):
            del sys.modules[name]
    monkeypatch.undo()
    analyses.rediscover()


def _reference_pass(records):
    """The graph of a small conv net after a reference pass that computes ``records`` (and what they need)."""
    import torch

    from preclint.engine import CheckOptions, build_graph
    from preclint.load.loader import LoadedModel
    from preclint.reference.analyses import resolve

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4))
    loaded = LoadedModel(model.eval(), (torch.randn(2, 3, 8, 8),), "scaffold", None)
    return build_graph(loaded, CheckOptions(modes=("bf16",)), resolve(records))


@pytest.mark.slow
@pytest.mark.parametrize("gradient", [False, True], ids=["forward", "gradient"])
def test_a_scaffolded_statistic_is_discovered_and_runs(scratch_analyses, gradient):
    from preclint.reference.analyses import every_analysis, writer_of

    new_rule = _script("new_rule")
    path = new_rule.scaffold_statistic("scaffolded-stat", "A scaffolded statistic.", directory=scratch_analyses,
                                       gradient=gradient)
    assert path.name == "scaffolded_stat.py"
    (analysis,) = [a for a in every_analysis() if a.__name__ == "ScaffoldedStatAnalysis"]
    record = analysis.record
    assert record.__name__ == "ScaffoldedStat" and writer_of(record) is analysis and analysis.gradients is gradient
    graph = _reference_pass([record])
    assert analysis in graph.analyses
    found = {node.module_type: node.record(record) for node in graph.nodes if node.record(record) is not None}
    if gradient:  # every value on the way to the output has a gradient
        assert {"Conv2d", "ReLU", "Linear"} <= set(found) and all(r.largest > 0 for r in found.values())
        # it hears the one pass from the outputs with the gains, and changes none of them
        from preclint.reference.analyses.gains import Gains

        gains = [{n.name: n.record(Gains) for n in _reference_pass(records).nodes} for records in ([Gains], [Gains, record])]
        assert gains[0] == gains[1] and any(gains[0].values())
    else:  # the ReLU zeroes some of the conv's outputs, and nothing else is an activation or elementwise
        assert set(found) == {"ReLU"} and 0 < found["ReLU"].zero_fraction < 1


def test_the_statistic_scaffold_from_the_command_line(scratch_analyses, monkeypatch, capsys):
    new_rule = _script("new_rule")
    monkeypatch.setattr(new_rule, "ANALYSES", scratch_analyses)
    assert new_rule.main(["--statistic", "scaffolded-peak", "A scaffolded statistic.", "--gradient"]) == 0
    assert "scaffolded_peak.py" in capsys.readouterr().out
    assert (scratch_analyses / "scaffolded_peak.py").exists()
    # a taken name: one line on stderr, exit 2, nothing written
    assert new_rule.main(["--statistic", "scaffolded-peak", "Again."]) == 2
    assert new_rule.main(["--statistic", "gains", "The gains again."]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("new_rule: ") for line in err)
    assert "already named Gains" in err[1]
    assert sorted(p.name for p in scratch_analyses.iterdir()) == ["scaffolded_peak.py"]


def test_the_statistic_scaffold_refuses_a_malformed_or_taken_name(tmp_path):
    new_rule = _script("new_rule")
    with pytest.raises(ValueError, match="kebab-case"):
        new_rule.scaffold_statistic("Bad Name", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="already named Terms"):
        new_rule.scaffold_statistic("terms", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="already named DecisionMargins"):
        new_rule.scaffold_statistic("decision-margins", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="summary"):
        new_rule.scaffold_statistic("fresh-name", "  ", directory=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("script", ["new_rule.py", "rule_table.py"])
def test_a_script_help_gives_its_first_paragraph_whole(script, capsys):
    """--help is built from the module's first paragraph, which spans lines: cut at the first line it
    stopped mid-sentence ("...documentation sections (Why it matters,")."""
    module = _script(script[:-3])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert " ".join(module.__doc__.split("\n\n")[0].split()) in text


def test_the_package_ships_its_type_marker():
    """PEP 561: without py.typed in the wheel, type checkers ignore the annotations of preclint.api."""
    assert (ROOT / "preclint" / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'preclint = ["py.typed"]' in pyproject.split("[tool.setuptools.package-data]")[1]
