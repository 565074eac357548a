"""Analyses: each writes one typed record, runs after those it depends on, and runs only where a
selected rule (or the predicted errors) reads its record."""
from dataclasses import dataclass

import pytest

from preclint.core.notes import texts
from preclint.reference.analyses.scaled_operands import ScaledOperandsAnalysis
import torch

from preclint.reference.analyses import Analysis, DependencyError, every_analysis, resolve, writer_of
from preclint.reference.analyses.batchnorm import BatchNormFolding
from preclint.reference.analyses.contraction import Contraction
from preclint.reference.analyses.decision_gains import DecisionGains, DecisionGainsAnalysis
from preclint.reference.analyses.gains import Gains
from preclint.reference.analyses.margins import DecisionMargins
from preclint.reference.analyses.reach import Reach, ReachAnalysis
from preclint.reference.analyses.terms import Terms
from preclint.engine import analyses_needed
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.rules import all_rules, graph_rules
from tests.helpers import check

# keys Node.attrs held for statistics before they became records: none may come back
STATISTICS_KEYS = {"condition", "contracted", "fp16_accumulation", "upstream_gain", "gap_gain", "decision_units",
                   "rounding_margins", "rounding_units"}


class _Decides(torch.nn.Module):
    """A conv, a batch norm, a linear, a sum, an argmax and a cast to integers: one of every record."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        h = self.bn(self.conv(x)).mean((2, 3))
        logits = self.fc(h)
        return logits, logits.argmax(-1), (logits * 10).long(), torch.einsum("bi,bj->bij", h, h).sum()


def _model():
    torch.manual_seed(0)
    model = _Decides().eval()
    with torch.no_grad():  # running statistics as a trained network has them
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.running_mean.uniform_(-1, 1)
    return model, (torch.randn(4, 3, 10, 10),)


def _records(graph):
    return {type(r) for n in graph.nodes for r in n.records.values()}


def test_each_analysis_writes_one_record_no_other_writes():
    analyses = every_analysis()
    records = [a.record for a in analyses]
    assert len(records) == len(set(records))
    for analysis in analyses:
        assert writer_of(analysis.record) is analysis
        for need in analysis.needs:
            writer_of(need)  # every record an analysis reads has a writer


@pytest.mark.subprocess
def test_analysis_modules_and_their_records_import_no_torch():
    """Rules import the records from the analyses' modules, and importing the rule pack imports no torch."""
    import subprocess
    import sys

    code = ("import sys\nfrom preclint.reference.analyses import analysis_modules, every_analysis\n"
            "every_analysis()\nassert analysis_modules() and 'torch' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dependencies_come_first():
    order = resolve([DecisionGains])
    assert order == [writer_of(need) for need in DecisionGainsAnalysis.needs] + [DecisionGainsAnalysis]
    everything = resolve(a.record for a in every_analysis())
    assert len(everything) == len(every_analysis())
    for i, analysis in enumerate(everything):
        earlier = {a.record for a in everything[:i]}
        assert set(analysis.needs) <= earlier, analysis.__name__
    # asking for a dependency too, or twice, runs it once, still before its user
    assert resolve([DecisionGains, DecisionMargins, DecisionGains]) == order


def test_a_cycle_and_a_record_nobody_writes_are_refused():
    @dataclass
    class A:
        x: int

    @dataclass
    class B:
        x: int

    class WritesA(Analysis):
        record, needs = A, (B,)

    class WritesB(Analysis):
        record, needs = B, (A,)

    with pytest.raises(DependencyError, match="A -> B -> A"):
        resolve([A], [WritesA, WritesB])
    with pytest.raises(DependencyError, match="0 analyses write B"):
        resolve([A], [WritesA])


def test_every_record_a_rule_reads_has_an_analysis():
    for rule in graph_rules():
        assert rule.needs is not None, f"{rule.code} declares no needs: it would get every analysis"
        for record in rule.needs:
            writer_of(record)


@pytest.mark.slow
def test_a_full_check_writes_typed_records_only():
    model, inputs = _model()
    _, graph, _ = check(model, inputs)
    found = _records(graph)
    assert {Terms, Contraction, Gains, DecisionMargins, BatchNormFolding, DecisionGains} <= found
    for node in graph.nodes:
        for kind, record in node.records.items():
            assert type(record) is kind and node.record(kind) is record
        assert not STATISTICS_KEYS & set(node.attrs), (node.name, node.attrs)
    # every analysis but the scaled formats' operands, computed only where a scaled mode is checked
    assert set(graph.analyses) == set(every_analysis()) - {ScaledOperandsAnalysis}


@pytest.mark.slow
def test_only_the_analyses_the_selected_rules_read_are_computed():
    model, inputs = _model()
    # PCL201 reads formats and value statistics: no analysis, and no backward pass
    report, graph, _ = check(model, inputs, select=["PCL201"], predict_errors=False)
    assert graph.analyses == () and _records(graph) == set()
    assert all(s["predicted_output"]["rel_error"] is None for s in report.summary.values())
    assert any("output errors are not predicted" in note for note in texts(report.notes))
    # PCL101 reads Reach only (no value here leaves float16's range, so not even the backward pass runs)
    _, graph, _ = check(model, inputs, select=["PCL101"], predict_errors=False)
    assert graph.analyses == (ReachAnalysis,) and _records(graph) == set()
    # with the predicted errors: what they read besides, and nothing else (not the batch norm's folding
    # of PCL103, nor the passes toward the amplifiers' inputs of PCL204)
    needs = PREDICTED_ERRORS_NEED + all_rules()["PCL101"].needs
    assert set(check(model, inputs, select=["PCL101"])[1].analyses) == set(resolve(needs))
    # PCL103: the batch norm's folding and what the predicted errors read
    _, graph, _ = check(model, inputs, select=["PCL103"], predict_errors=False)
    assert set(graph.analyses) == set(resolve(PREDICTED_ERRORS_NEED + (BatchNormFolding,)))


def test_what_is_needed_follows_the_rules_needs():
    rules = all_rules()
    assert analyses_needed([rules["PCL101"]]) == [ReachAnalysis]
    assert analyses_needed([rules["PCL201"], rules["PCL105"]]) == []
    assert analyses_needed([rules["PCL201"]], also=[DecisionGains]) == resolve([DecisionGains])
    assert set(analyses_needed(graph_rules())) == set(every_analysis())


@pytest.mark.slow
def test_a_rule_checked_alone_finds_what_it_finds_in_a_full_check():
    # fewer analyses must not change a selected rule's findings
    for code in ("PCL101", "PCL102", "PCL105", "PCL201"):
        rule = all_rules()[code]
        for example in rule.bad:
            module, inputs = example.build()
            full, _, _ = check(module, inputs, **example.options)
            alone, graph, _ = check(module, inputs, select=[code], predict_errors=False, **example.options)
            assert set(graph.analyses) <= set(resolve(rule.needs))
            mine = [f.message for f in full.findings if f.code == code]
            assert mine and mine == [f.message for f in alone.findings], (code, example.description)


@pytest.mark.slow
def test_the_gains_toward_a_decision_are_the_same_without_the_gains():
    """The passes toward a decision weigh the operands the gains weigh: they watch them themselves, so
    computed alone they are those of a full reference pass."""
    from preclint.engine import CheckOptions, build_graph
    from preclint.load.loader import LoadedModel

    model, inputs = _model()
    loaded = LoadedModel(model, inputs, "model", None)
    graphs = [build_graph(loaded, CheckOptions(modes=("bf16",)), analyses)
              for analyses in (resolve([DecisionGains]), resolve(a.record for a in every_analysis()))]
    alone, full = ({n.name: n.record(DecisionGains) for n in g.nodes if n.record(DecisionGains)} for g in graphs)
    assert Gains not in {a.record for a in graphs[0].analyses}
    assert alone and alone == full
    assert any(operands > 0 for record in alone.values() for _, operands in record.upstream.values())


def test_reach_is_recorded_where_values_leave_float16s_range():
    class Large(torch.nn.Module):
        def forward(self, x):
            return (x * 1e6).tanh() + (x * 1e6).mean(-1, keepdim=True) * 1e-6  # the first product saturates

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8),)
    _, alone, _ = check(Large(), inputs, select=["PCL101"], predict_errors=False)
    _, full, _ = check(Large(), inputs)
    reached = {n.name: n.record(Reach) for n in alone.nodes if n.record(Reach) is not None}
    assert reached and all(r.absmax > 65504 for r in reached.values())
    assert reached == {n.name: n.record(Reach) for n in full.nodes if n.record(Reach) is not None}
    assert all(n.record(Gains) is None for n in alone.nodes)


@pytest.mark.slow
def test_the_command_line_selection_decides_what_is_computed(capsys, tmp_path):
    """`check --select PCL101` finds what the full check finds and predicts no output error; the HTML
    page, which draws every layer's predicted error, gets them whatever the selection."""
    import json

    from preclint.cli import main
    from tests.cli.test_cli import EXAMPLE

    main(["check", EXAMPLE, "--output-format", "json", "--exit-zero"])
    full = json.loads(capsys.readouterr().out)
    main(["check", EXAMPLE, "--select", "PCL101", "--output-format", "json", "--exit-zero"])
    alone = json.loads(capsys.readouterr().out)
    assert [f for f in full["findings"] if f["code"] == "PCL101"] == alone["findings"] != []
    assert full["summary"]["bf16"]["predicted_output"]["rel_error"] is not None
    assert all(s["predicted_output"]["rel_error"] is None for s in alone["summary"].values())
    page = tmp_path / "report.html"
    main(["check", EXAMPLE, "--select", "PCL101", "--output-format", "html", "--output", str(page), "--exit-zero"])
    assert "output errors are not predicted" not in page.read_text()
