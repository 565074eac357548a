"""The ``answers`` attacks of benchmarks.fuzz.attacks: hostile inputs whose answer must stay true (the
issue "Trust, round 3", item 6).

- ``diff-nan``, ``diff-inf``, ``diff-negvar``, ``diff-overflow``: ``preclint diff`` of a sound checkpoint
  and one with NaN or inf weights, a negative batch-norm running variance, or a folded batch-norm
  scale of 10^k undone by the next layer (float32's outputs agree, fp16's overflow): exit 1, the broken
  one named the fragile one, never "do not part" or "not compared: an output error is not known";
- ``huge``: activations scaled by 2^k (k from 60 to 90, squares beyond float32) and back: no PCL203,
  the bf16 and tf32 outputs predicted finite (float32's range holds them) and the fp16 output not
  (beyond 65504);
- ``amax-epsilon``: ``--scaling amax-epsilon=10^k`` (k from 4 to 38) above every amax of a small MLP
  under a scaled format: PCL111, exit 1 (never "All checks passed!" or "No findings.");
- ``complex``, ``fraction``, ``range``: a checkpoint the model's dtypes cannot hold without loss (an
  imaginary part, fractions for an integer buffer, values beyond float32): exit 2, one line.
"""
from __future__ import annotations

import json
import random

from benchmarks.fuzz.attack_oracle import judge_attack
from benchmarks.fuzz.oracle import Checked, Verdict

VARIANTS = ("diff-nan", "diff-inf", "diff-negvar", "diff-overflow", "huge", "amax-epsilon", "complex", "fraction",
            "range")

BN_NET = """import torch
from torch import nn

torch.manual_seed({seed})
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8)).eval()
model.register_buffer("steps", torch.zeros((), dtype=torch.int64))
example_inputs = (torch.randn(4, 16),)
"""

HUGE_NET = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x) * {scale!r})) / {scale!r}


torch.manual_seed({seed})
model = Net().eval()
example_inputs = (torch.randn(4, 16),)
"""

MLP = """import torch
from torch import nn

torch.manual_seed({seed})
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
example_inputs = (torch.randn(16, 64),)
"""


def params(rng: random.Random, variant: str) -> dict:
    drawn = {"exponent": rng.randint(60, 90) if variant == "huge" else rng.randint(4, 38)}
    if variant == "diff-overflow":
        drawn["exponent"] = rng.randint(5, 8)  # 10^5 .. 10^8: beyond float16's 65504, within float32
    if variant == "amax-epsilon":
        drawn["precision"] = rng.choice(("fp8", "fp8-rowwise", "nvfp4"))
    return drawn


def answers(case, directory: str) -> Checked:
    from benchmarks.fuzz.attacks import run, write

    seed = int(case.params["seed"])
    variant = case.variant
    if variant == "huge":
        write(directory, "m.py", HUGE_NET.format(scale=2.0 ** int(case.params["exponent"]), seed=seed % 1000))
        argv = ["check", "m.py", "--precision", "bf16,tf32,fp16", "--output-format", "json"]
        result = run(argv, directory)
        return Checked(_huge(result, argv), result)
    if variant == "amax-epsilon":
        write(directory, "m.py", MLP.format(seed=seed % 1000))
        epsilon = f"1e{int(case.params['exponent'])}"
        argv = ["check", "m.py", "--precision", str(case.params["precision"]), "--scaling", f"amax-epsilon={epsilon}",
                "--output-format", "concise"]
        result = run(argv, directory)
        verdict = judge_attack(result, argv, {1, 2})
        if verdict.ok and result.rc == 1 and "PCL111" not in result.stdout:
            verdict = Verdict("false-answer", f"amax-epsilon={epsilon} zeroes the GEMMs and no PCL111 says so")
        return Checked(verdict, result)
    write(directory, "net.py", BN_NET.format(seed=seed % 1000))
    _save(directory, variant, int(case.params["exponent"]), seed)
    if variant in ("complex", "fraction", "range"):
        argv = ["check", "net.py", "--weights", "b.pt"]
        result = run(argv, directory)
        verdict = judge_attack(result, argv, {2})
        if verdict.ok and ("cannot hold" not in result.stderr or result.stderr.strip().count("\n")):
            verdict = Verdict("false-answer", f"a lossy cast ({variant}) is not one line naming it: {result.stderr[-200:]!r}")
        return Checked(verdict, result)
    argv = ["diff", "net.py", "--weights", "a.pt", "--weights", "b.pt", "-q"]
    result = run(argv, directory)
    verdict = judge_attack(result, argv, {1})
    said = result.stdout
    if verdict.ok and ("b is the fragile one" not in said or "do not part" in said or "not known" in said):
        verdict = Verdict("false-answer", f"{variant}: the broken checkpoint is not named the fragile one")
    return Checked(verdict, result)


def _save(directory: str, variant: str, exponent: int, seed: int) -> None:
    import os

    import torch

    torch.manual_seed(seed % 1000)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8))
    model.register_buffer("steps", torch.zeros((), dtype=torch.int64))
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: v.clone() for k, v in a.items()}
    rng = random.Random(seed)
    row, column = rng.randrange(32), rng.randrange(16)
    if variant == "diff-nan":
        b["0.weight"][row, column] = float("nan")
    elif variant == "diff-inf":
        b["0.weight"][row, column] = rng.choice((1, -1)) * float("inf")
    elif variant == "diff-negvar":
        b["1.running_var"][row] = -rng.uniform(1e-3, 10.0)
    elif variant == "diff-overflow":
        b["1.weight"] *= 10.0 ** exponent
        b["1.bias"] *= 10.0 ** exponent
        b["3.weight"] /= 10.0 ** exponent
    elif variant == "complex":
        b["0.weight"] = b["0.weight"] + 1j * torch.rand(32, 16)
    elif variant == "fraction":
        b["steps"] = torch.tensor(rng.uniform(0.1, 100.0))
    else:  # range
        b["0.bias"] = b["0.bias"].double()
        b["0.bias"][row] = 10.0 ** (39 + exponent)
    torch.save(a, os.path.join(directory, "a.pt"))
    torch.save(b, os.path.join(directory, "b.pt"))


def _huge(result, argv) -> Verdict:
    verdict = judge_attack(result, argv, {0, 1})
    if not verdict.ok:
        return verdict
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        return Verdict("false-answer", "the json report does not parse")
    codes = {f.get("code") for f in doc.get("findings", [])}
    if "PCL203" in codes:
        return Verdict("false-answer", "activations near 2^k give a PCL203 (preclint's own squares overflow)")
    finite = {m: entry.get("predicted_output", {}).get("finite") for m, entry in doc.get("summary", {}).items()}
    wrong = [m for m, f in finite.items() if f is not (m != "fp16")]
    if wrong:
        return Verdict("false-answer", f"the predicted output's finiteness is wrong under {', '.join(wrong)} ({finite})")
    return verdict
