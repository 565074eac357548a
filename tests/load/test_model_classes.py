"""Model classes that are not plain eager float32 modules, checked as users hand them over:
TorchScript (scripted, traced, loaded from a file) and torch.compile'd modules."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

from preclint.cli import main

pytestmark = pytest.mark.slow  # each runs the whole check on a model

CNN = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))

    torch.manual_seed(0)
    example_inputs = (torch.randn(2, 3, 8, 8),)
"""


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def check_json(capsys, *argv):
    code = main(["check", "--isolated", "--output-format", "json", *argv])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return json.loads(out)


def predicted(report, mode):
    return report["summary"][mode]["predicted_output"]["rel_error"]


def measured(report, mode):
    return report["summary"][mode]["measured_output"]["rel_error"]


@pytest.mark.parametrize("make", ["model = torch.jit.script(Net().eval())",
                                  "model = torch.jit.trace(Net().eval(), example_inputs)"])
def test_a_torchscript_module_is_checked_through_its_graph(tmp_path, capsys, make):
    path = write(tmp_path, "scripted.py", textwrap.dedent(CNN) + make + "\n")
    report = check_json(capsys, path, "--probe", "cpu")
    assert not report.get("error")
    assert any("TorchScript module" in note and "converted to aten ops" in note for note in report["notes"])
    for mode in ("fp16", "bf16"):
        # the convs and matmuls it runs are there: a float model's errors, predicted and measured
        assert predicted(report, mode) > 1e-5 and measured(report, mode) > 1e-5
        assert 1 / 3 < predicted(report, mode) / measured(report, mode) < 3
    # the ops are named after the submodules whose weights they read
    assert "aten.linear in fc" in [layer["module"] for layer in report["summary"]["bf16"]["top_layers"]]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def test_a_loaded_torchscript_file_is_checked(tmp_path, capsys):
    torch.jit.save(torch.jit.script(Net().eval()), str(tmp_path / "net.jit"))
    path = write(tmp_path, "loaded.py", f"""
        import torch
        model = torch.jit.load({str(tmp_path / 'net.jit')!r})
        example_inputs = (torch.randn(2, 3, 8, 8),)
    """)
    report = check_json(capsys, path)
    assert predicted(report, "bf16") > 1e-5


def test_torchscript_that_does_not_convert_says_what_to_pass(tmp_path, capsys):
    path = write(tmp_path, "loop.py", """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = nn.LSTMCell(8, 16)

            def forward(self, x):
                h = torch.zeros(x.shape[0], 16)
                c = torch.zeros(x.shape[0], 16)
                for t in range(x.shape[1]):
                    h, c = self.cell(x[:, t], (h, c))
                return h

        model = torch.jit.script(Net().eval())
        example_inputs = (torch.randn(2, 5, 8),)
    """)
    code = main(["check", "--isolated", path])
    out, err = capsys.readouterr()
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "internal error" not in err
    assert "TorchScript module (scripted)" in err and "eager nn.Module" in err and "--weights" in err


def test_a_compiled_module_is_checked_through_the_module_it_compiles(tmp_path, capsys):
    path = write(tmp_path, "compiled.py", """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = torch.compile(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)))
        example_inputs = (torch.randn(4, 32),)
    """)
    from torch._dynamo.utils import counters

    counters.clear()
    report = check_json(capsys, path)
    assert not counters["stats"]["calls_captured"]  # Dynamo compiled nothing, preclint's hooks included
    assert any("torch.compile'd module" in note and "outside Dynamo" in note for note in report["notes"])
    assert report["capture"] == "fx"
    assert "_orig_mod" not in json.dumps(report)



COMPILED_PARTS = """
    import torch
    from torch import nn
    import torch.nn.functional as F
    torch.manual_seed(0)


    @torch.compile
    def gate(x):
        return F.gelu(x) * torch.sigmoid(x)


    class Net(nn.Module):
        def __init__(self, compiled: bool):
            super().__init__()
            self.compiled = compiled
            self.first = nn.Linear(32, 64)
            self.second = torch.compile(nn.Linear(64, 16)) if compiled else nn.Linear(64, 16)

        def forward(self, x):
            h = self.first(x)
            return self.second(gate(h) if self.compiled else F.gelu(h) * torch.sigmoid(h))


    model = Net(COMPILED).eval()
    example_inputs = (torch.randn(4, 32),)
"""


def test_what_a_model_compiles_of_itself_runs_eagerly_under_the_check(tmp_path, capsys):
    """A compiled layer and a compiled function inside the model: Dynamo compiles nothing (neither
    them nor preclint's hooks), and the check predicts what it predicts for the uncompiled twin."""
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = check_json(capsys, write(tmp_path, "parts.py", COMPILED_PARTS.replace("COMPILED", "True")))
    assert not counters["stats"]["calls_captured"] and not counters["frames"]["total"]
    twin = check_json(capsys, write(tmp_path, "twin.py", COMPILED_PARTS.replace("COMPILED", "False")))
    for mode in ("tf32", "fp16", "bf16"):
        assert predicted(compiled, mode) == pytest.approx(predicted(twin, mode), rel=1e-6)

LLAMA_DECODE = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()


    def example_inputs():
        with torch.no_grad():
            cache = model(torch.randint(0, 128, (1, 8)), use_cache=True).past_key_values
        return {"input_ids": torch.randint(0, 128, (1, 1)), "past_key_values": cache, "use_cache": True}
"""


def test_a_transformers_decode_step_with_a_dynamic_cache_is_checked(tmp_path, capsys):
    path = write(tmp_path, "decode.py", LLAMA_DECODE)
    report = check_json(capsys, path, "--probe", "cpu", "--precision", "bf16")
    outputs = report["summary"]["bf16"]["outputs"]
    names = [o["output"] for o in outputs]
    # the cache's tensors are outputs with names of their own, each one step longer than it came in
    assert names == ["output['logits']", "output['cache'].layers[0].keys", "output['cache'].layers[0].values",
                     "output['cache'].layers[1].keys", "output['cache'].layers[1].values"]
    measured = report["summary"]["bf16"]["measured_output"]["outputs"]
    for predicted, figure in zip(outputs, measured):
        assert predicted["rel_error"] > 0 and figure["rel_error"] > 0
        assert 1 / 3 < predicted["rel_error"] / figure["rel_error"] < 3, predicted["output"]


class _Cache:
    """A cache object of the user's own: no pytree registration, no dataclass."""

    def __init__(self, keys):
        self.keys = keys
        self.steps = 0

    def update(self, key):
        self.keys = torch.cat([self.keys, key], dim=1)
        self.steps += 1
        return self.keys


class _Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, cache):
        keys = cache.update(self.fc(x))
        return torch.softmax(x @ keys.transpose(1, 2), dim=-1) @ keys, cache


def test_a_cache_object_is_its_tensors_and_every_run_gets_a_fresh_copy():
    from preclint.load.modelio import Inputs, output_leaves

    cache = _Cache(torch.randn(2, 5, 16))
    inputs = Inputs((torch.randn(2, 1, 16), cache))
    assert len(inputs.tensors()) == 2
    doubled = inputs.map(lambda t: t.double())
    assert doubled.args[1] is not cache and doubled.args[1].keys.dtype == torch.float64 and cache.keys.dtype == torch.float32
    model = _Step().eval()
    first, second = inputs.call(model), inputs.call(model)
    assert first[1].keys.shape == second[1].keys.shape == (2, 6, 16)  # not grown twice
    assert cache.keys.shape == (2, 5, 16) and cache.steps == 0  # the user's cache is untouched
    assert [path for path, _ in output_leaves(first)] == ["[0]", "[1].keys"]  # its tensors


def test_the_check_reads_a_cache_object_of_the_users_own():
    from tests.helpers import check

    report, graph, _ = check(_Step(), (torch.randn(2, 1, 16), _Cache(3 * torch.randn(2, 5, 16))), precisions=("bf16",))
    assert [o["output"] for o in report.summary["bf16"]["outputs"]] == ["output[0]", "output[1].keys"]
    assert graph.capture == "function-mode"  # torch.fx would record cache.update as one opaque call
    assert [n.name for n in graph.nodes if n.kind == "input"] == ["input_0", "input_1"]
    assert all(o["rel_error"] > 0 for o in report.summary["bf16"]["outputs"])


@pytest.mark.parametrize("dtype, stored", [("bfloat16", "bf16"), ("float16", "fp16")])
def test_a_model_stored_in_a_reduced_dtype_is_judged_as_it_runs(tmp_path, capsys, dtype, stored):
    path = write(tmp_path, "low.py", f"""
        import torch
        from torch import nn
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval().to(torch.{dtype})
        example_inputs = (torch.randn(2, 8, 32, dtype=torch.{dtype}),)
    """)
    report = check_json(capsys, path, "--probe", "cpu")
    own = f"{stored}-full"
    # tf32 and autocast to its own dtype change nothing of it: its own dtype is how it runs, measured too
    assert report["precisions"] == [own]
    assert any(f"stored in {dtype}" in note and f"{own} (its values cast to {dtype}, which they already are) is "
               "how it runs" in note for note in report["notes"])
    predicted_error, measured_error = predicted(report, own), measured(report, own)
    assert measured_error > 1e-4  # a reduced dtype's own error, not float32's
    assert 1 / 3 < predicted_error / measured_error < 3
    report = check_json(capsys, path, "--probe", "cpu", "--precision", "fp32,fp16-full,bf16-full")
    assert report["precisions"] == ["fp32", "fp16-full", "bf16-full"]
    for mode in report["precisions"]:  # the CPU probe measures every mode it predicts
        assert measured(report, mode) > 0
    assert measured(report, "fp32") < 1e-5 < measured(report, own)


def test_the_modes_of_a_stored_model():
    from preclint.load.model_classes import modes_as_stored

    assert modes_as_stored(("tf32", "fp16", "bf16"), "", "m") == (("tf32", "fp16", "bf16"), [])
    modes, (stored,) = modes_as_stored(("tf32", "fp16", "bf16"), "bf16", "m")
    assert modes == ("bf16-full",) and stored.kind == "load"
    note = stored.text
    assert "tf32 and bf16 change nothing" in note and "fp16 autocast of a bfloat16 model" in note
    assert modes_as_stored(("fp16",), "bf16", "m")[0] == ("bf16-full",)
    assert modes_as_stored(("fp32", "tf32", "bf16-full", "fp8"), "fp16", "m")[0] == ("fp32", "fp16-full", "bf16-full", "fp8")


def test_the_users_module_is_left_as_it_was_given():
    import preclint

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    report = preclint.check(model, (torch.randn(4, 16, dtype=torch.bfloat16),))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert list(report.precisions) == ["bf16-full"]


QUANTIZED = """
    import torch
    from torch import nn
    torch.manual_seed(0)
    float_model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.LayerNorm(16)).eval()
    model = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear}, dtype=torch.qint8)
    example_inputs = (torch.randn(4, 32),)
"""


def test_a_dynamically_quantized_model_says_what_is_int8_and_what_is_float(tmp_path, capsys):
    path = write(tmp_path, "quantized.py", QUANTIZED)
    report = check_json(capsys, path, "--probe", "cpu")
    (note,) = [n for n in report["notes"] if "is quantized" in n]
    assert "2 layers run in int8 (dynamic Linear)" in note and "1 layer with float weights (3 (LayerNorm))" in note
    # each int8 layer's weight rounding, from its scale: a step of 2*absmax/255 over the weights' RMS
    rounding = dict(part.split(": ") for part in note.split("scale/sqrt(12)): ")[1].split("; ")[0].split(", "))
    assert set(rounding) == {"0", "2"} and all(1e-3 < float(v) < 1e-2 for v in rounding.values())
    assert "not modelled" in note
    for mode in ("tf32", "fp16", "bf16"):
        # TF32 and autocast leave the int8 layers as they are (the CPU emulation once rounded their
        # inputs to TF32 as if they were float Linears: 0.002 measured, 0 predicted)
        assert predicted(report, mode) == 0 and measured(report, mode) == 0


def test_a_model_partly_in_a_reduced_dtype_is_named_so_and_left_as_it_is():
    from preclint.load.model_classes import as_float32
    from preclint.load.modelio import Inputs

    model = torch.nn.Sequential(torch.nn.Linear(8, 8).to(torch.bfloat16), torch.nn.LayerNorm(8))
    call = Inputs((torch.randn(2, 8, dtype=torch.bfloat16),))
    module, same_call, stored, (mixed,) = as_float32(model, call, "m.py", in_place=True)
    assert module is model and same_call is call and stored == "" and mixed.kind == "load"
    note = mixed.text
    assert model[0].weight.dtype == torch.bfloat16
    assert note.startswith("m.py: 2 of its 4 floating parameters") and "the probe measures it as it is" in note
