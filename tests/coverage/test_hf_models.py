"""`preclint check` end to end on tiny Hugging Face and timm models, called as their users call them:
keyword inputs from the file (a dict, or positional with None) and from `--input`."""
import json
import textwrap
from pathlib import Path

import pytest

from preclint.cli import main
from tests.paths import MODELS

TINY = str(MODELS / "hf_tiny.py")


def check(capsys, *argv):
    """The JSON report of `preclint check ARGV`; any exit but 2 (findings are the rules' business)."""
    code = main(["check", *argv, "--output-format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return json.loads(out)


def predicted(report, mode="tf32"):
    return report["summary"][mode]["predicted_output"]["rel_error"]


def t5_file(tmp_path, example_inputs):
    path = tmp_path / "t5_model.py"
    path.write_text(textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(Path(TINY).parent)!r})
        from hf_tiny import t5 as model

        def example_inputs():
            input_ids = torch.randint(0, 512, (1, 12))
            decoder_input_ids = torch.randint(0, 512, (1, 6))
            return {example_inputs}
    """))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("example_inputs", [
    "(input_ids, None, decoder_input_ids)",  # model(input_ids, None, decoder_input_ids)
    "dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), decoder_input_ids=decoder_input_ids)",
    "((input_ids,), dict(decoder_input_ids=decoder_input_ids, use_cache=False))",
])
def test_t5_with_its_inputs_as_users_write_them(capsys, tmp_path, example_inputs):
    report = check(capsys, t5_file(tmp_path, example_inputs), "--model", "model")
    assert 0 < predicted(report) < 1e-2
    assert not any("input" in note and "drawn" in note for note in report["notes"])


@pytest.mark.slow
def test_bert_with_named_inputs_on_the_command_line_and_the_probe(capsys):
    report = check(capsys, TINY, "--model", "bert", "--input", "input_ids=2x16:int64",
                   "--input", "token_type_ids=2x16:int64", "--input", "attention_mask=2x16:int64:1",
                   "--precision", "bf16", "--probe", "cpu")
    assert 0 < predicted(report, "bf16") < 0.1
    measured = report["summary"]["bf16"]["measured_output"]["rel_error"]
    assert 0 < measured < 0.1
    drawn = next(note for note in report["notes"] if note.startswith("integer inputs drawn"))
    assert "input_ids below 300" in drawn and "token_type_ids below 2" in drawn


@pytest.mark.slow
def test_gpt2_with_a_dict_of_inputs(capsys, tmp_path):
    path = tmp_path / "gpt2_model.py"
    path.write_text(textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(Path(TINY).parent)!r})
        from hf_tiny import gpt2 as model

        example_inputs = {{"input_ids": torch.randint(0, 300, (1, 16)), "attention_mask": torch.ones(1, 16)}}
    """))
    report = check(capsys, str(path), "--model", "model")
    assert 0 < predicted(report) < 1e-2


@pytest.mark.slow
def test_vit_with_pixel_values(capsys):
    report = check(capsys, TINY, "--model", "vit", "--input", "pixel_values=1x3x32x32")
    assert 0 < predicted(report) < 1e-2


@pytest.mark.slow
def test_whisper_with_input_features(capsys):
    report = check(capsys, TINY, "--model", "whisper", "--input", "input_features=1x16x64",
                   "--input", "decoder_input_ids=1x4:int64")
    assert 0 < predicted(report) < 1e-2
    assert any("decoder_input_ids below 300" in note for note in report["notes"])


@pytest.mark.slow
def test_timm_model_with_a_keyword_input_traces_with_fx(capsys):
    report = check(capsys, TINY, "--model", "timm_resnet", "--input", "x=1x3x32x32")
    assert report["capture"] == "fx"
    assert 0 < predicted(report) < 1e-2
