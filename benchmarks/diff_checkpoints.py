"""Benchmark: do the layers `preclint diff` ranks first agree with swapping one layer's weights at a time?

Two checkpoints of one small ResNet-like network (blocks of a 3x3 convolution, batch norm, a 1x1
convolution with no activation before it, as in Xception's separable blocks, and batch norm) differ
only in their batch norms: in B, a stage's first batch norm shifts its output by a constant c (its
bias), and the second's running mean takes in what that shift becomes after the 1x1 convolution.
In exact arithmetic A and B compute the same function. In float16 the convolution stores the large
common offset, rounded, and what is left after the batch norm subtracts it again carries that
rounding. Three of the four stages are shifted (c = 30, 50, 100 in an order drawn per seed).

The ground truth swaps one unit (the stem, a stage, the classifier) at a time, both ways (A, B and
every hybrid compute one function): A with that unit's tensors from B, the growth of A's squared
fp16 error over the gap between B's and A's squared errors (``into_a``: each unit's effect alone),
and B with that unit's tensors from A, the part of the gap the swap removes (``out_of_b``: its
effect within B). The two differ where a stage's error hides under the coarser rounding of a later
stage's offset (a rounding to a grid coarser than an incoming error mostly erases it): in B the
effects of two shifted stages do not add. The prediction is first order and so ranks the effects
alone; the probe measures B as it runs. `preclint diff` ranks the
same units by the fraction of the gap its layers account for, predicted (no probe) and measured
(``--probe``). The figure is the overlap of the two top-3 lists, per seed.

    python benchmarks/diff_checkpoints.py --device cpu --seeds 0,1,2 --out benchmarks/results/diff_checkpoints_cpu.json
    python benchmarks/diff_checkpoints.py --device cuda --seeds 0,1,2,3,4,5 --width 32 --out benchmarks/results/diff_checkpoints_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
from torch import nn

STAGES = ("layer1", "layer2", "layer3", "layer4")
UNITS = ("stem",) + STAGES + ("fc",)
WIDTH = 16
SHAPE = (48, 3, 16, 16)
SHIFTS = (0.0, 30.0, 50.0, 100.0)  # one per stage: effects of about 9, 25 and 100 (squared)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(self.bn1(self.conv1(x)))))


class SmallResNet(nn.Module):
    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.layer1, self.layer2, self.layer3, self.layer4 = (Block(width) for _ in STAGES)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


def _calibrate(model: nn.Module, data: torch.Tensor) -> None:
    """Every batch norm's running statistics re-estimated on ``data`` (a cumulative average)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for batch in data.split(8):
            model(batch)
    model.eval()


def checkpoints(seed: int, width: int):
    """A and B (state dicts) and the shift each stage of B got."""
    torch.manual_seed(seed)
    data = torch.randn(64, *SHAPE[1:], generator=torch.Generator().manual_seed(1000 + seed))
    a = SmallResNet(width)
    _calibrate(a, data)
    b = SmallResNet(width)
    b.load_state_dict(a.state_dict())
    b.eval()
    generator = torch.Generator().manual_seed(2000 + seed)
    # the shifts 0, 30, 50 and 100, in another order over the stages for every seed
    order = torch.randperm(len(STAGES), generator=generator).tolist()
    shifts = {stage: SHIFTS[i] for stage, i in zip(STAGES, order)}
    with torch.no_grad():
        for stage, shift in shifts.items():
            block = getattr(b, stage)
            block.bn1.bias.add_(shift)
            # the 1x1 convolution turns the shift into c * (sum of each output channel's weights)
            block.bn2.running_mean.add_(shift * block.conv2.weight.sum(dim=(1, 2, 3)))
    return a.state_dict(), b.state_dict(), shifts


def unit_of(module: str) -> str:
    top = module.split(".")[0] if module else ""
    return "stem" if top in ("stem", "bn") else top


def fp16_error(model: nn.Module, inputs, device: str) -> float:
    from preclint.measure.compare import compare
    from preclint.measure.runners import run_mode, run_reference

    model = model.to(device).eval()
    out = run_mode(model, inputs, "fp16", device)
    ref = run_reference(model, inputs, device)
    return compare([out.detach().cpu()], [ref.detach().cpu()]).rel_rms


def swap_ranking(a_state, b_state, inputs, width: int, device: str) -> dict:
    """Per unit, over the gap between B's and A's squared fp16 errors: the growth of A's with B's
    tensors there (``into_a``), and the fall of B's with A's tensors there (``out_of_b``)."""
    def error(state):
        model = SmallResNet(width)
        model.load_state_dict(state)
        return fp16_error(model, inputs, device)

    ea, eb = error(a_state), error(b_state)
    gap = eb ** 2 - ea ** 2
    into_a, out_of_b = {}, {}
    for unit in UNITS:
        prefixes = ("stem.", "bn.") if unit == "stem" else (unit + ".",)
        with_b = {k: (b_state[k] if k.startswith(prefixes) else v) for k, v in a_state.items()}
        with_a = {k: (a_state[k] if k.startswith(prefixes) else v) for k, v in b_state.items()}
        into_a[unit] = (error(with_b) ** 2 - ea ** 2) / gap if gap > 0 else 0.0
        out_of_b[unit] = (eb ** 2 - error(with_a) ** 2) / gap if gap > 0 else 0.0
    return {"error_a": ea, "error_b": eb, "into_a": into_a, "out_of_b": out_of_b}


def diff_ranking(a_path: str, b_path: str, width: int, probe_device) -> dict:
    """`preclint diff`'s fraction of the gap per unit (its module groups), and its sentence."""
    from preclint.config import Config
    from preclint.diff.walk import DiffRequest, run_diff
    from preclint.engine import CheckOptions, LoadOptions
    from preclint.probe import ProbeOptions

    config = Config(precisions=("fp16",))
    load = LoadOptions(model=f"SmallResNet{width}", input_shapes=[SHAPE], seed=0)
    probe = ProbeOptions(device=probe_device) if probe_device else None
    result = run_diff(config, load, CheckOptions(modes=("fp16",)), DiffRequest((__file__,), (a_path, b_path)), probe)
    (mode,) = result.modes
    shares = {unit: 0.0 for unit in UNITS}
    for layer in mode.layers:
        unit = unit_of(layer.module)
        if unit in shares:
            shares[unit] += layer.of_gap
    return {"error_a": mode.error_a, "error_b": mode.error_b, "shares": shares, "sentence": mode.sentence,
            "inputs": result.sides[0].loaded.inputs}


def top3(scores: dict, at_least: float = -float("inf")) -> list:
    """The (at most) three units of largest score, those at ``at_least`` or more only."""
    return [unit for unit, score in sorted(scores.items(), key=lambda item: -item[1])[:3] if score >= at_least]


# a swap that moves less of the gap than this is a tie with the units whose swap moves nothing: the
# run-to-run spread of an output's squared error over 480 numbers is about sqrt(2/480) = 6.5%
SIGNIFICANT = 0.05


def overlap(ranked: list, truth: list) -> dict:
    """How many of the truth's units (its top 3 that matter) are in ``ranked`` (diff's top 3)."""
    return {"of": len(truth), "found": len(set(ranked) & set(truth))}


def run(seed: int, width: int, device: str) -> dict:
    a_state, b_state, shifts = checkpoints(seed, width)
    with tempfile.TemporaryDirectory() as folder:
        a_path, b_path = os.path.join(folder, "A.pt"), os.path.join(folder, "B.pt")
        torch.save(a_state, a_path)
        torch.save(b_state, b_path)
        predicted = diff_ranking(a_path, b_path, width, None)
        measured = diff_ranking(a_path, b_path, width, device)
    inputs = predicted.pop("inputs")
    measured.pop("inputs")
    truth = swap_ranking(a_state, b_state, inputs, width, device)
    row = {"seed": seed, "shifts": shifts, "swap": truth, "predicted": predicted, "measured": measured,
           "top3": {"into_a": top3(truth["into_a"], SIGNIFICANT), "out_of_b": top3(truth["out_of_b"], SIGNIFICANT),
                    "predicted": top3(predicted["shares"]), "measured": top3(measured["shares"])}}
    row["overlap"] = {f"{kind}_vs_{way}": overlap(row["top3"][kind], row["top3"][way])
                      for kind in ("predicted", "measured") for way in ("into_a", "out_of_b")}
    return row


def _factory(width: int):
    return lambda: SmallResNet(width)


# the loader builds the model by name: one factory per width the benchmark uses
for _width in (8, 16, 32, 64):
    globals()[f"SmallResNet{_width}"] = _factory(_width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cuda", "cpu"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--width", type=int, default=WIDTH, choices=(8, 16, 32, 64))
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.provenance import stamp

    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        row = run(seed, args.width, args.device)
        rows.append(row)
        found = ", ".join(f"{k} {v['found']}/{v['of']}" for k, v in row["overlap"].items())
        print(f"seed {seed}: {row['top3']}; {found}; B/A fp16 error {row['swap']['error_b'] / row['swap']['error_a']:.3g}",
              flush=True)
    summary = {key: {"seeds_with_2_of_3": sum(r["overlap"][key]["found"] >= min(2, r["overlap"][key]["of"]) for r in rows),
                     "found": sum(r["overlap"][key]["found"] for r in rows), "of": sum(r["overlap"][key]["of"] for r in rows)}
               for key in rows[0]["overlap"]}
    summary["seeds"] = len(rows)
    summary["error_ratio_b_over_a"] = [round(r["swap"]["error_b"] / r["swap"]["error_a"], 3) for r in rows]
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(stamp({"device": args.device, "width": args.width, "summary": summary, "seeds": rows}), handle,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
