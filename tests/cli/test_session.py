"""The session (preclint.engine.Session): one model's walk, the same whether the command line drives
it with a path or Python code with a model it built; findings located and suppressed once, after the
probe."""
import importlib.util
import json
import textwrap

import pytest
import torch

from preclint.core.notes import texts
from preclint.cli import main
from preclint.config import Config
from preclint.core.errors import UserError
from preclint.engine import CheckOptions, PlanOptions, Session
from preclint.plan.command import render_plan
from preclint.probe import ProbeOptions
from preclint.report import render_reports

OVERFLOW = """
    import torch
    from torch import nn


    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            y = self.fc(x) * 70000.0{comment}
            return torch.softmax(y, dim=-1)


    def example_inputs():
        torch.manual_seed(0)
        return (torch.randn(4, 16),)
"""


def model_file(tmp_path, comment=""):
    path = tmp_path / "scaled.py"
    path.write_text(textwrap.dedent(OVERFLOW.format(comment=comment)))
    return str(path)


def built(path):
    """The model and inputs of the file, built by the test as a user's own code would."""
    spec = importlib.util.spec_from_file_location("scaled_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)  # the weights the loader draws (--seed 0)
    return module.Scaled(), module.example_inputs()


def cli(capsys, *argv):
    code = main(list(argv))
    out, _ = capsys.readouterr()
    return code, out


@pytest.mark.slow
def test_a_path_gets_the_report_the_command_line_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = model_file(tmp_path)
    code, printed = cli(capsys, "check", path, "--probe", "cpu", "--output-format", "json", "--isolated")
    config = Config(output_format="json")
    with Session(config, probe=ProbeOptions(device="cpu")) as session:
        report = session.check(path)
    assert code == 1
    assert render_reports([report], "json") == printed


@pytest.mark.slow
def test_a_built_module_gets_the_findings_of_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = model_file(tmp_path)
    session = Session(Config(), probe=ProbeOptions(device="cpu"))
    from_path = session.check(path)
    module, inputs = built(path)
    from_module = session.check(module, inputs)
    assert from_module.model == "Scaled" and from_path.model.endswith("scaled.py:Scaled")

    def seen(report):
        return [(f.code, f.location, f.message, f.status) for f in report.findings]

    assert seen(from_module) == seen(from_path)
    assert any(f.code == "PCL101" and f.status == "confirmed" for f in from_module.findings)
    assert all(f.location.path == "scaled.py" for f in from_module.findings if f.code == "PCL101")


def test_a_suppression_holds_for_a_finding_the_probe_confirmed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = model_file(tmp_path, comment="  # preclint: ignore[PCL101]")
    report = Session(Config(), probe=ProbeOptions(device="cpu")).check(path)
    assert "PCL101" not in {f.code for f in report.findings}
    module, inputs = built(path)
    assert "PCL101" not in {f.code for f in Session(Config()).check(module, inputs).findings}


def test_a_built_module_is_checked_in_eval_mode_and_given_back_in_its_own(tmp_path):
    module, inputs = built(model_file(tmp_path))
    module.train()
    seen = []
    module.fc.register_forward_hook(lambda m, args, out: seen.append(m.training))  # (FX calls a leaf module)
    Session(Config(precisions=("fp16",))).check(module, inputs)
    assert seen and not any(seen)
    assert module.training and all(m.training for m in module.modules())


@pytest.mark.parametrize("target, inputs, message", [
    (torch.nn.Linear(4, 4), None, "give the inputs"),
    (42, (), "expected a path or a torch.nn.Module"),
])
def test_a_target_the_session_cannot_take_is_one_clear_error(target, inputs, message):
    with pytest.raises(UserError, match=message):
        Session(Config()).check(target, inputs)


def test_a_failing_model_becomes_a_report_with_its_error_and_the_next_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    broken = tmp_path / "broken.py"
    broken.write_text("from torch import nn\n\nclass Broken(nn.Module):\n    def forward(self, x):\n"
                      "        return x.view(3, 7)\n\nimport torch\nexample_inputs = (torch.randn(2, 4),)\n")
    told = []
    reports = Session(Config()).check_each([str(broken), model_file(tmp_path)],
                                           on_error=lambda exc: told.append(str(exc)) or "it failed")
    assert [r.error for r in reports] == ["it failed", None]
    assert len(told) == 1 and "Broken failed on its example inputs" in told[0]
    with pytest.raises(UserError, match="Broken failed on its example inputs"):
        Session(Config()).check(str(broken))


def test_the_plan_of_a_built_module_is_the_plan_of_its_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = model_file(tmp_path)
    code, printed = cli(capsys, "plan", path, "--precision", "fp16", "--rtol", "1e-2", "--atol", "1e-3",
                        "--no-verify", "--output-format", "json", "--isolated")
    config = Config(rtol=1e-2, atol=1e-3)
    session = Session(config, check=CheckOptions(modes=("fp16",), rtol=1e-2, atol=1e-3),
                      plan=PlanOptions(verify=False))
    report, plan = session.plan(path)
    assert render_plan(report, plan, "json") == printed
    module, inputs = built(path)
    _, from_module = session.plan(module, inputs)
    assert json.loads(render_plan(report, from_module, "json"))["keep"] == json.loads(printed)["keep"]
    assert code == (0 if plan.meets_tolerance else 1)


@pytest.mark.parametrize("modes, config, message", [
    (("fp16", "bf16"), Config(rtol=1e-2), "plan takes one --precision"),
    (("tf32",), Config(rtol=1e-2), "plan takes one --precision"),
    (("fp16",), Config(), "plan needs the tolerance to meet"),
])
def test_plan_settings_that_cannot_make_a_plan_fail_before_any_model_loads(modes, config, message):
    with pytest.raises(UserError, match=message):
        Session(config, check=CheckOptions(modes=modes, rtol=config.rtol), plan=PlanOptions())


def forced_placement(monkeypatch):
    """The probe's device copy made on the CPU too (on a GPU it is made there): the walk a GPU takes."""
    import preclint.probe
    from preclint.probe.device_copy import place

    monkeypatch.setattr(preclint.probe, "place_for_probe",
                        lambda loaded, options: place(loaded.module, loaded.inputs, torch.device("cpu"), force=True))


@pytest.mark.slow
def test_the_reference_pass_on_the_probes_copy_gives_the_same_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = model_file(tmp_path)
    plain = Session(Config(), probe=ProbeOptions(device="cpu")).check(path)
    forced_placement(monkeypatch)
    placed = Session(Config(), probe=ProbeOptions(device="cpu")).check(path)
    assert placed.environment["reference"]["statistics_on"] == "cpu"
    assert [(f.code, f.location, f.message, f.status) for f in placed.findings] == \
           [(f.code, f.location, f.message, f.status) for f in plain.findings]


def test_a_reference_pass_out_of_memory_on_the_device_runs_on_the_cpu(tmp_path, monkeypatch):
    import preclint.engine

    monkeypatch.chdir(tmp_path)
    forced_placement(monkeypatch)
    check_graph = preclint.engine.check_graph

    def short_of_memory(loaded, config, options):
        if options.placement is not None:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return check_graph(loaded, config, options)

    monkeypatch.setattr(preclint.engine, "check_graph", short_of_memory)
    report = Session(Config(), probe=ProbeOptions(device="cpu")).check(model_file(tmp_path))
    assert "the reference statistics were computed on the CPU: cpu ran out of memory" in texts(report.notes)
    assert "statistics_on" not in report.environment["reference"]
    assert any(f.code == "PCL101" and f.status == "confirmed" for f in report.findings)
