"""Example inputs and a launch environment that a model file or a CI job can get wrong, or make
hostile, end in one line and exit 2, never "internal error": example inputs nested 100,000 deep, a list
that holds itself, a 10**12-element ``expand`` view (4 bytes as a view, 4 TB as the copy the check
makes); a torchrun environment half set (WORLD_SIZE without RANK, a LOCAL_RANK that is no number, no
MASTER_ADDR)."""
from __future__ import annotations

import textwrap

import pytest

from preclint.cli import main

MODEL = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, *rest, **keywords):
            return self.fc(torch.ones(2, 8))

"""
INPUTS = {
    "deep.py": """
        v = torch.randn(2, 8)
        for _ in range(100_000):
            v = [v]
        example_inputs = (v,)
    """,
    "holds_itself.py": """
        v = [torch.randn(2, 8)]
        v.append(v)
        example_inputs = (v,)
    """,
    "dict_holds_itself.py": """
        d = {"x": torch.randn(2, 8)}
        d["again"] = d
        example_inputs = d
    """,
    "expand.py": "example_inputs = (torch.zeros(1).expand(10**12),)",
    "expand_keyword.py": 'example_inputs = ((torch.randn(2, 8),), {"mask": torch.zeros(1).expand(10**12)})',
    "expand_tensor.py": "example_inputs = torch.zeros(1).expand(10**12)",
    "expand_lightning.py": "Net.example_input_array = torch.zeros(1, 1).expand(10**6, 10**6)",
    "doubling.py": """
        v = [torch.randn(2, 8)]
        for _ in range(60):
            v = [v, v]  # 2**60 paths through 61 lists: no cycle, but no end to a walk either
        example_inputs = (v,)
    """,
    "wide.py": "example_inputs = ([[None] * 1000] * 2000,)",
    "many_tensors_one_view_each.py": "t = torch.zeros(1).expand(10**9)\nexample_inputs = ([t] * 10_000,)",
}
EXPECTED = {
    "deep.py": "deep.py: example_inputs nests deeper than 32 levels of lists, tuples and dicts",
    "holds_itself.py": "holds_itself.py: example_inputs[0][1] is a list that holds itself",
    "dict_holds_itself.py": "dict_holds_itself.py: example_inputs['again'] is a dict that holds itself",
    "expand.py": "expand.py: example_inputs takes 3.6 TiB as tensors of their own (an expanded view counts",
    "expand_keyword.py": "expand_keyword.py: example_inputs takes 3.6 TiB as tensors of their own",
    "expand_tensor.py": "expand_tensor.py: example_inputs takes 3.6 TiB as tensors of their own",
    "expand_lightning.py": "expand_lightning.py: example_input_array takes 3.6 TiB as tensors of their own",
    "doubling.py": "doubling.py: example_inputs nests deeper than 32 levels",
    "wide.py": "wide.py: example_inputs holds more than 1,000,000 values",
    "many_tensors_one_view_each.py": "takes 36.4 TiB as tensors of their own",
}


@pytest.fixture
def model_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, inputs in INPUTS.items():
        (tmp_path / name).write_text(textwrap.dedent(MODEL) + textwrap.dedent(inputs))
    return tmp_path


def one_line_error(capsys, *argv) -> str:
    code = main(["check", *argv, "--output-format", "concise", "-q"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    return err


@pytest.mark.slow
@pytest.mark.parametrize("name", list(INPUTS))
def test_hostile_example_inputs_are_one_line_and_exit_2(model_files, capsys, name):
    assert EXPECTED[name] in one_line_error(capsys, name)


@pytest.mark.slow
def test_inputs_that_share_a_tensor_or_a_list_are_no_cycle(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shared = "t = torch.randn(2, 8)\nrow = [t, t]\nexample_inputs = (t, row, row, {'a': row, 'b': (row, [row])})\n"
    (tmp_path / "shared.py").write_text(textwrap.dedent(MODEL) + shared)
    assert main(["check", "shared.py", "--output-format", "concise", "-q"]) in (0, 1), capsys.readouterr().err


ENVIRONMENTS = [
    ({"WORLD_SIZE": "2"}, "the environment sets WORLD_SIZE=2 but no RANK (torchrun sets both)"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"}, "the environment sets LOCAL_RANK='x', which is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "x"}, "the environment sets RANK='x', which is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "the environment sets RANK=2, outside the 2 ranks of WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1"}, "the environment sets LOCAL_RANK=-1"),
    ({"WORLD_SIZE": "two"}, "the environment sets WORLD_SIZE='two', which is not a whole number"),
    ({"WORLD_SIZE": "0"}, "the environment sets WORLD_SIZE=0; a world has at least one process"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "rank 0 of 2 could not join torchrun's process group: ValueError: "
                                       "Error initializing torch.distributed using env:// rendezvous: environment "
                                       "variable MASTER_ADDR expected, but not set"),
]


@pytest.mark.slow
@pytest.mark.parametrize("environment, needle", ENVIRONMENTS, ids=[" ".join(f"{k}={v}" for k, v in e.items())
                                                                    for e, _ in ENVIRONMENTS])
def test_a_half_set_torchrun_environment_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, environment, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(MODEL) + "example_inputs = (torch.randn(2, 8),)\n")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    err = one_line_error(capsys, "net.py", "--probe", "cpu")
    assert needle in err and "start preclint with torchrun, or unset WORLD_SIZE" in err, err


@pytest.mark.slow
def test_a_single_process_environment_is_one_process(tmp_path, monkeypatch, capsys):
    """WORLD_SIZE=1 (and a LOCAL_RANK without a WORLD_SIZE) is one process: the check runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(MODEL) + "example_inputs = (torch.randn(2, 8),)\n")
    for environment in ({"WORLD_SIZE": "1", "RANK": "3"}, {"LOCAL_RANK": "x"}):
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        assert main(["check", "net.py", "--output-format", "concise", "-q"]) in (0, 1), capsys.readouterr().err
