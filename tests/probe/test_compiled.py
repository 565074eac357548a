"""The model compiled with Inductor on the CPU beside eager (probe/compiled.py): what fusion does to
the output error, where it does it, and whether the float32 decisions of the code survive.

Compiling is slow on this machine (seconds a graph): every model is tiny, each is compiled once per
fixture, and the tests that compile are marked slow."""
import json
import re

import pytest
import torch

from preclint.core.notes import texts
from preclint.cli import main
from preclint.measure.compiled_graph import foreign_dtypes
from preclint.probe.compiled import FLOAT32_NOISE, compare_backend
from tests.helpers import check
from tests.models import compiled_effects as effects
from tests.paths import ROOT

MODELS = ROOT / "tests" / "models" / "compiled_effects.py"


def _compared(build, modes, attribute=False):
    module, inputs = build()
    _, graph, _ = check(module, inputs, precisions=modes)
    return compare_backend(module, inputs, graph, modes, "cpu", "inductor", attribute=attribute)


@pytest.fixture(scope="module")
def chain():
    return _compared(effects.pointwise_chain, ("bf16", "fp16"))


@pytest.fixture(scope="module")
def norm():
    return _compared(effects.fused_norm, ("bf16",), attribute=True)


@pytest.mark.slow
def test_a_fused_pointwise_chain_keeps_float32_where_eager_rounds(chain):
    for mode in ("bf16", "fp16"):
        m = chain.modes[mode]
        assert m.error is None and m.compilation.error is None
        # the fused chain skips eager's roundings: closer to float64, and visibly not eager
        assert m.compiled < m.eager and m.compiled_vs_eager > FLOAT32_NOISE
        # Inductor's own switch to reproduce eager does: every rounding kept, the same numbers
        assert m.emulated_casts == pytest.approx(m.eager, rel=1e-9) and m.emulated_vs_eager == 0.0
        assert m.compilation.graphs == 1 and not m.compilation.graph_breaks and m.compilation.recompiles == 0
        assert m.compilation.seconds > 0 and any(k.fused for k in m.compilation.graph.kernels)


@pytest.mark.slow
def test_each_mode_compiles_afresh_in_its_own_precision(chain):
    """The guard against a stale compilation: every mode's graph computes only in its own reduced format,
    and the check that catches a graph of another precision flags the bf16 graph against the fp16 run."""
    bf16, fp16 = chain.modes["bf16"], chain.modes["fp16"]
    assert "bfloat16" in bf16.compiled_dtypes and "float16" not in bf16.compiled_dtypes
    assert "float16" in fp16.compiled_dtypes and "bfloat16" not in fp16.compiled_dtypes
    assert bf16.foreign_dtypes == [] and fp16.foreign_dtypes == []
    assert bf16.output_dtypes == (["bfloat16"], ["bfloat16"]) and fp16.output_dtypes == (["float16"], ["float16"])
    assert foreign_dtypes(bf16.compiled_dtypes, fp16.eager_dtypes) == ["bfloat16"]


@pytest.mark.slow
def test_the_block_holding_the_gap_is_named_with_its_fused_kernel_and_roundings(norm):
    m = norm.modes["bf16"]
    assert m.compiled < m.eager
    blocks = {b.path: b for b in m.blocks}
    assert set(blocks) == {"a", "norm", "b"}
    worst = blocks["norm"]
    # the norm's fusion is the whole gap; the linear layers compile to the same products as eager
    assert worst.part == pytest.approx(1.0, abs=0.05)
    assert abs(blocks["a"].part) < 0.05 and abs(blocks["b"].part) < 0.05
    assert worst.local_compiled < worst.local_eager and worst.received > 0
    assert worst.fused and all("fused" in k for k in worst.fused)
    elided_ops = {re.search(r"\((\w+), (\w+)\)", text).group(2) for text in worst.elided}
    assert {"mul", "mean"} <= elided_ops, worst.elided
    assert worst.emulated_back_to_eager is True


@pytest.mark.slow
def test_the_codes_float32_region_stays_float32_compiled():
    m = _compared(effects.kept_region, ("bf16",)).modes["bf16"]
    by_what = {c.site.what: c for c in m.kept}
    region, call = by_what["autocast(enabled=False) region"], by_what[".float() call"]
    assert region.compiled_ops >= 2 and not region.offending
    assert call.compiled_ops >= 1 and not call.offending
    assert region.site.path.endswith("compiled_effects.py")


@pytest.mark.slow
def test_graph_breaks_are_counted_and_the_model_still_measured():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.a(x)
            if float(y.sum()) > -1e9:  # a Python decision on a value: Dynamo breaks the graph here
                y = y * 2.0
            return self.b(y)

    torch.manual_seed(0)
    compared = _compared(lambda: (Branchy().eval(), (torch.randn(4, 16),)), ("bf16",))
    m = compared.modes["bf16"]
    assert m.compilation.graphs >= 2 and sum(m.compilation.graph_breaks.values()) >= 1
    assert m.compiled is not None and m.eager is not None


def test_a_model_that_cannot_compile_is_measured_eagerly_with_one_note(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("the compiler failed")

    monkeypatch.setattr(torch, "compile", refuse)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
    compared = compare_backend(module, (torch.randn(2, 8),), None, ("bf16",), "cpu", "inductor", attribute=False)
    m = compared.modes["bf16"]
    assert m.compilation.error == "RuntimeError: the compiler failed"
    assert m.eager is not None and m.compiled is None
    assert len(compared.notes) == 1 and "measured eagerly only" in texts(compared.notes)[0]


def test_the_command_lines_backends_are_the_measure_layers():
    import pkgutil

    from preclint.measure import compilers
    from preclint.probe import BACKEND_CHOICES as PROBE_BACKENDS

    found = sorted(info.name for info in pkgutil.iter_modules(compilers.__path__) if not info.name.startswith("_"))
    assert PROBE_BACKENDS == ("eager", *found) and "inductor" in found


def test_backend_without_the_probe_is_one_line_and_exit_2(capsys):
    code = main(["check", str(MODELS), "--backend", "inductor"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--probe" in err and "Traceback" not in err


@pytest.mark.slow
def test_probe_with_inductor_reports_both_errors_in_json(capsys):
    code = main(["probe", str(MODELS), "--model", "PointwiseChain", "--input-shape", "32,64", "--device", "cpu",
                 "--backend", "inductor", "--precision", "bf16", "--output-format", "json", "--exit-zero", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    compiled = doc["summary"]["bf16"]["compiled_output"]
    assert compiled["compiled_rel_error"] < compiled["eager_rel_error"]
    assert compiled["difference"] == pytest.approx(compiled["compiled_rel_error"] - compiled["eager_rel_error"])
    backend = doc["environment"]["backend"]
    assert backend["backend"] == "inductor" and backend["modes"]["bf16"]["compilation"]["graphs"] == 1
    assert any(n.startswith("compiled: bf16 with inductor on cpu") for n in doc["notes"])
