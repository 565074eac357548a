"""Benchmark: the training step (``check --train``). Predicted gradient underflow, lost updates and
non-finite updates of one step, against the same figures measured: each precision's step run natively on
the CPU (autocast and the CPU's float16/bfloat16 kernels) and compared with a float64 step, element by
element (probe/training.py). Tiny models, one thread:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/training.py --out benchmarks/results/training_cpu.json
    python benchmarks/training.py --device cuda --out benchmarks/results/training_h100.json   # steps on a GPU

The setups: an MLP regression, a CNN with batch norm and a small transformer encoder, each under fp16 and
bf16 autocast (float32 weights and optimizer) and pure fp16/bf16 (``-full``), with SGD and with Adam; the
three cases issue 40 starts from (an fp16-autocast regression without a GradScaler whose gradients flush,
pure-bf16 SGD at lr 1e-4, ``model.half()`` with Adam); and the clean recipes (fp32, bf16 autocast with
float32 master weights, fp16 autocast with a GradScaler at a sane learning rate), which must get no
training finding. Agreement: predicted and measured within 3x of each other, or both below 1%.

``--suite fp8``: the FP8 recipes (fp8, fp8-rowwise, mxfp8; each step's GEMMs emulated, measure/scaled_training.py)
on an MLP classifier and a small transformer with a 128-token vocabulary (every linear layer but attention's
converts), each at logit scale 1 (clean) and 100 (the softmax's gradient spans more than the gradient
format keeps: PCL605), and the MLP regression; the flushed share of the converted layers' output gradients
is compared too:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/training.py --suite fp8 --out benchmarks/results/training_fp8_cpu.json

``--suite scaled``: the fp8 suite's setups and the same models under ``nvfp4`` (NVIDIA's NVFP4 training
recipe, emulated: E2M1 with E4M3 scales per 16, 16 x 16 weight tiles, stochastically rounded gradients,
the random Hadamard transform of the weight gradient's operands), and the step rules judged against the
measured step: PCL601 is expected where over 1% of the gradient elements flushed, PCL602 where over 1%
more updates were lost than float32 storage loses (the predicted baseline), and found or not by the check:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/training.py --suite scaled --out benchmarks/results/training_scaled_cpu.json

``--suite delayed``: ``fp8`` with Transformer Engine's delayed scaling (``--scaling amax-history=1024``):
the first step predicted and measured as above (a fresh amax history's scale of 1.0), and STEPS steps
measured beside current scaling, the share of the converted layers' output gradient flushed at each:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/training.py --suite delayed --out benchmarks/results/training_delayed_cpu.json
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from typing import Any, Dict, List

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.provenance import stamp  # noqa: E402
from preclint.core.notes import Note, texts  # noqa: E402
from preclint.config import Config  # noqa: E402
from preclint.core.numerics import scaled_recipes  # noqa: E402
from preclint.engine import CheckOptions, check_model  # noqa: E402
from preclint.load.loader import LoadedModel  # noqa: E402
from preclint.load.training import training_step_of  # noqa: E402
from preclint.probe.training import measure_training  # noqa: E402

TRAINING_CODES = ("PCL601", "PCL602", "PCL603", "PCL604", "PCL605")
FIGURES = ("underflow_fraction", "lost_update_fraction")
BELOW = 0.01
FACTOR = 3.0


def mlp(loss_weight: float = 1.0, activation=torch.nn.ReLU):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), activation(), torch.nn.Linear(64, 64), activation(),
                                torch.nn.Linear(64, 1))
    inputs, targets = (torch.randn(256, 32),), torch.randn(256, 1) * loss_weight

    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output, target) * loss_weight

    return model, inputs, targets, loss_fn


def cnn(loss_weight: float = 1.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    inputs, targets = (torch.randn(16, 3, 16, 16),), torch.randint(0, 10, (16,))

    def loss_fn(output, target):
        return torch.nn.functional.cross_entropy(output, target) * loss_weight

    return model, inputs, targets, loss_fn


class TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.encoder = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 100)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def transformer(loss_weight: float = 1.0):
    torch.manual_seed(0)
    model = TinyTransformer()
    ids = torch.randint(0, 100, (8, 16))
    targets = torch.randint(0, 100, (8, 16))

    def loss_fn(output, target):
        return torch.nn.functional.cross_entropy(output.reshape(-1, 100), target.reshape(-1)) * loss_weight

    return model, (ids,), targets, loss_fn


def mlp_tanh(loss_weight: float = 1.0):
    """The MLP with Tanh: no mask for the forward's rounding to flip (the gradient error's floor)."""
    return mlp(loss_weight, torch.nn.Tanh)


def classifier(loss_weight: float = 1.0, logit_scale: float = 1.0):
    """An MLP classifier over 128 classes whose cross-entropy reads its logits times ``logit_scale``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 128))
    inputs, targets = (torch.randn(256, 32),), torch.randint(0, 128, (256,))

    def loss_fn(output, target):
        return torch.nn.functional.cross_entropy(output * logit_scale, target) * loss_weight

    return model, inputs, targets, loss_fn


class Transformer128(TinyTransformer):
    """The small transformer with a 128-token vocabulary: its head converts under the FP8 recipes (in and out
    features multiples of 16), as its feed-forward layers do."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(128, 32)
        self.head = torch.nn.Linear(32, 128)


def transformer128(loss_weight: float = 1.0, logit_scale: float = 1.0):
    torch.manual_seed(0)
    model = Transformer128()
    ids, targets = torch.randint(0, 128, (8, 32)), torch.randint(0, 128, (8, 32))

    def loss_fn(output, target):
        return torch.nn.functional.cross_entropy(output.reshape(-1, 128) * logit_scale, target.reshape(-1)) * loss_weight

    return model, (ids,), targets, loss_fn


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "mlp_tanh": mlp_tanh, "classifier": classifier,
          "transformer128": transformer128}
SCALED_MODES = ("fp8", "fp8-rowwise", "mxfp8")
OPTIMIZERS = {"sgd": lambda lr: (lambda params: torch.optim.SGD(params, lr=lr)),
              "adam": lambda lr: (lambda params: torch.optim.Adam(params, lr=lr))}


def setups() -> List[Dict[str, Any]]:
    """name, model, optimizer, lr, precision, and the options that make a case."""
    found = []
    for model in ("mlp", "cnn", "transformer"):
        for optimizer, lr in (("sgd", 1e-2), ("adam", 1e-3)):
            for mode in ("fp16", "bf16", "fp16-full", "bf16-full"):
                found.append(dict(name=f"{model}/{optimizer}/{mode}", model=model, optimizer=optimizer, lr=lr, mode=mode))
    found += [
        dict(name="issue/mlp-fp16-tiny-loss-no-scaler", model="mlp", optimizer="sgd", lr=1e-2, mode="fp16", loss_weight=1e-4),
        dict(name="issue/mlp-fp16-small-loss-no-scaler", model="mlp", optimizer="sgd", lr=1e-2, mode="fp16", loss_weight=1e-3),
        dict(name="issue/mlp-pure-bf16-sgd-lr1e-4", model="mlp", optimizer="sgd", lr=1e-4, mode="bf16-full"),
        dict(name="issue/mlp-half-adam", model="mlp", optimizer="adam", lr=1e-3, mode="fp16-full", half=True),
        dict(name="issue/cnn-fp16-tiny-loss-no-scaler", model="cnn", optimizer="sgd", lr=1e-2, mode="fp16", loss_weight=1e-6),
    ]
    found += [dict(name=f"tanh/mlp/sgd/{mode}", model="mlp_tanh", optimizer="sgd", lr=1e-2, mode=mode)
              for mode in ("fp16", "bf16")]
    for model in ("mlp", "cnn", "transformer"):
        found += [
            dict(name=f"clean/{model}/fp32-sgd", model=model, optimizer="sgd", lr=1e-2, mode="fp32", clean=True),
            dict(name=f"clean/{model}/bf16-autocast-adam", model=model, optimizer="adam", lr=1e-3, mode="bf16", clean=True),
            dict(name=f"clean/{model}/fp16-autocast-gradscaler-adam", model=model, optimizer="adam", lr=1e-3, mode="fp16",
                 scaler=True, clean=True),
            dict(name=f"clean/{model}/fp16-autocast-gradscaler-sgd", model=model, optimizer="sgd", lr=1e-2, mode="fp16",
                 scaler=True, clean=True),
        ]
    return found


def fp8_setups() -> List[Dict[str, Any]]:
    """The FP8 recipes: clean (logit scale 1) and flushing (logit scale 100) classifiers and transformers."""
    found = []
    for model in ("classifier", "transformer128"):
        for mode in SCALED_MODES:
            found.append(dict(name=f"fp8/{model}/adam/{mode}", model=model, optimizer="adam", lr=1e-3, mode=mode,
                              clean=True))
            found.append(dict(name=f"fp8/{model}-logit-scale-100/adam/{mode}", model=model, optimizer="adam", lr=1e-3,
                              mode=mode, logit_scale=100.0, expect="PCL605"))
    found += [dict(name=f"fp8/mlp-regression/sgd/{mode}", model="mlp", optimizer="sgd", lr=1e-2, mode=mode, clean=True)
              for mode in SCALED_MODES]
    return found


def scaled_setups() -> List[Dict[str, Any]]:
    """The FP8 setups and the same models under NVFP4 training."""
    found = fp8_setups()
    for model in ("classifier", "transformer128"):
        found.append(dict(name=f"nvfp4/{model}/adam", model=model, optimizer="adam", lr=1e-3, mode="nvfp4", clean=True))
        found.append(dict(name=f"nvfp4/{model}-logit-scale-100/adam", model=model, optimizer="adam", lr=1e-3,
                          mode="nvfp4", logit_scale=100.0, expect="PCL605"))
    found.append(dict(name="nvfp4/mlp-regression/sgd", model="mlp", optimizer="sgd", lr=1e-2, mode="nvfp4", clean=True))
    return found


DELAYED = {"amax-history": 1024}
STEPS = 8


def delayed_setups() -> List[Dict[str, Any]]:
    """fp8 with delayed scaling: a regression whose gradients lie below E5M2's 7.6e-6 (loss weight 1e-3),
    and three whose do not."""
    return [dict(name="delayed/mlp-regression-loss-1e-3/adam", model="mlp", optimizer="adam", lr=1e-3, mode="fp8",
                 loss_weight=1e-3, scaling=DELAYED, expect="PCL605", steps=STEPS),
            dict(name="delayed/mlp-regression/sgd", model="mlp", optimizer="sgd", lr=1e-2, mode="fp8", scaling=DELAYED,
                 clean=True, steps=STEPS),
            dict(name="delayed/classifier/adam", model="classifier", optimizer="adam", lr=1e-3, mode="fp8",
                 scaling=DELAYED, clean=True, steps=STEPS),
            dict(name="delayed/transformer128/adam", model="transformer128", optimizer="adam", lr=1e-3, mode="fp8",
                 scaling=DELAYED, clean=True, steps=STEPS)]


def step_rules_expected(predicted, measured) -> List[str]:
    """The step rules the measured step calls for: PCL601 over STEP_SHARE of the gradient elements flushed,
    PCL602 over STEP_SHARE more updates lost than float32 storage loses."""
    expected = []
    if measured.underflow_fraction > BELOW:
        expected.append("PCL601")
    if measured.lost_update_fraction - (predicted.float32_lost_update_fraction or 0.0) > BELOW:
        expected.append("PCL602")
    return expected


def agree(predicted: float, measured: float) -> bool:
    return (predicted < BELOW and measured < BELOW) or (measured / FACTOR <= predicted <= measured * FACTOR)


def run_setup(setup: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    with scaled_recipes(setup.get("scaling")):
        row = _run_setup(setup, device)
    if setup.get("steps"):
        row["trajectory"] = _trajectories(setup, device)
    return row


def _trajectories(setup: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    """Each step's flushed share of the converted layers' output gradients, loss and parting step, under the
    setup's scaling and under current scaling."""
    from preclint.measure.training_step import StepRequest
    from preclint.measure.trajectory import trajectories

    found = {}
    for label, scaling in (("delayed", setup.get("scaling")), ("current", None)):
        module, inputs, targets, loss_fn = _model_of(setup)
        step = training_step_of(loss_fn=loss_fn, targets=targets, make_optimizer=OPTIMIZERS[setup["optimizer"]](setup["lr"]))
        with scaled_recipes(scaling):
            path = trajectories(StepRequest(module, inputs, step, device=device), [setup["mode"]], setup["steps"])[setup["mode"]]
        found[label] = {key: value for key, value in path.as_dict().items()
                        if key in ("parts_at", "loss", "loss_float32", "scaled_gradient_underflow", "scaled_gradient_saturated")}
    return found


def _model_of(setup: Dict[str, Any]):
    extra = {"logit_scale": setup["logit_scale"]} if "logit_scale" in setup else {}
    return MODELS[setup["model"]](setup.get("loss_weight", 1.0), **extra)


def _run_setup(setup: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    extra = {"logit_scale": setup["logit_scale"]} if "logit_scale" in setup else {}
    module, inputs, targets, loss_fn = MODELS[setup["model"]](setup.get("loss_weight", 1.0), **extra)
    if setup.get("half"):
        module = module.half()
        inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    step = training_step_of(loss_fn=loss_fn, targets=targets, make_optimizer=OPTIMIZERS[setup["optimizer"]](setup["lr"]),
                            scaler=torch.amp.GradScaler(device.type) if setup.get("scaler") else None)
    loaded = LoadedModel(module.eval(), inputs, setup["name"], None, training=step)
    started = time.perf_counter()
    report, _graph, ctx = check_model(loaded, Config(precisions=(setup["mode"],), scaling=dict(setup.get("scaling") or {})),
                                      CheckOptions(modes=(setup["mode"],), train=True))
    notes: List[Note] = []
    measured = measure_training(loaded, ctx.training_reference, list(ctx.training), device, notes)
    (mode,) = list(ctx.training)
    predicted, seen = ctx.training[mode], measured[mode]
    row = {"mode": mode, "seconds": round(time.perf_counter() - started, 2),
           "findings": sorted({f.code for f in report.findings if f.code in TRAINING_CODES}),
           "clean": bool(setup.get("clean")), "notes": texts(notes)}
    for key in FIGURES + ("nonfinite_updates", "grad_rel_error"):
        row[key] = {"predicted": getattr(predicted, key), "measured": getattr(seen, key)}
    row["agree"] = all(agree(row[key]["predicted"], row[key]["measured"]) for key in FIGURES)
    row["nonfinite_agree"] = (predicted.nonfinite_updates > 0) == (seen.nonfinite_updates > 0)
    row["loss_scale"] = predicted.loss_scale
    if predicted.scaled:
        scaled = _scaled_rows(predicted.as_dict(), seen.as_dict())
        row.update(scaled)
        row["agree"] = row["agree"] and agree(*scaled["scaled_gradient_underflow_fraction"].values())
    if "expect" in setup:
        row["expected_finding"] = setup["expect"] in row["findings"]
    row["step_rules"] = {"expected": step_rules_expected(predicted, seen),
                         "found": [code for code in row["findings"] if code in ("PCL601", "PCL602")]}
    row["float32_lost_update_fraction"] = predicted.float32_lost_update_fraction
    return row


def _scaled_rows(predicted: Dict[str, Any], measured: Dict[str, Any]) -> Dict[str, Any]:
    """The flushed share of the converted layers' output gradients, over them all and per layer, with each
    layer's per-tensor scale and its flushed shares across blocks of 32 (min, median, p99), predicted and measured."""
    layers = {}
    for path, stats in predicted["scaled"].items():
        seen = measured["scaled"].get(path, {})
        layers[path] = {operand: {"underflow_fraction": [figures["underflow_fraction"],
                                                         seen.get(operand, {}).get("underflow_fraction")],
                                  "tensor_scale": [figures["tensor_scale"], seen.get(operand, {}).get("tensor_scale")],
                                  "block_underflow": [figures["blocks"]["underflow_fraction"],
                                                      seen.get(operand, {}).get("blocks", {}).get("underflow_fraction")]}
                        for operand, figures in stats.items()}
    return {"scaled_gradient_underflow_fraction": {
                "predicted": predicted["scaled_gradient_underflow_fraction"],
                "measured": measured["scaled_gradient_underflow_fraction"]},
            "scaled_gradient_saturated_fraction": {
                "predicted": predicted["scaled_gradient_saturated_fraction"],
                "measured": measured["scaled_gradient_saturated_fraction"]},
            "scaled_layers": layers}


class _Mask(torch.nn.Module):
    """A ReLU that records its float64 input's signs, compares a low-precision input's with them, or
    applies the float64 signs in place of its own (the masks forced equal)."""

    def __init__(self, store: Dict[Any, Any], index: int, how: str) -> None:
        super().__init__()
        self.store, self.index, self.how = store, index, how

    def __deepcopy__(self, memo):  # the copies a step makes share the store
        return _Mask(self.store, self.index, self.how)

    def forward(self, x):
        if self.how == "record":
            self.store[self.index] = x.detach().double() > 0
        elif self.how == "compare":
            self.store["flips", self.index] = float(((x.detach().double() > 0) != self.store[self.index]).double().mean())
        else:
            return x * self.store[self.index].to(x.dtype)
        return torch.relu(x)


def mask_attribution(model: str, dtype: torch.dtype) -> Dict[str, Any]:
    """One autocast step's gradient against float64's: the share of ReLU inputs whose sign the low-precision
    forward flips, the gradient's relative error, and that error with the float64 masks forced on."""
    module, (x,), y, loss_fn = MODELS[model]()
    module.train()
    store: Dict[Any, Any] = {}
    relus = [name for name, m in module.named_modules() if isinstance(m, torch.nn.ReLU)]

    def set_masks(how):
        for i, name in enumerate(relus):
            parent, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, leaf, _Mask(store, i, how))

    def gradients(low):
        copied = copy.deepcopy(module)
        if low is None:
            copied = copied.double()
            loss = loss_fn(copied(x.double()), y.double() if y.is_floating_point() else y)
        else:
            with torch.autocast("cpu", dtype=low):
                loss = loss_fn(copied(x), y)
        return [g.double() for g in torch.autograd.grad(loss, list(copied.parameters()))]

    def error(found, reference):
        return math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(found, reference))
                         / sum(float(b.pow(2).sum()) for b in reference))

    set_masks("record")
    reference = gradients(None)
    set_masks("compare")
    plain = gradients(dtype)
    flips = [store["flips", i] for i in range(len(relus))]
    set_masks("force")
    return {"relu_flip_fraction": flips, "grad_rel_error": error(plain, reference),
            "masks_forced_grad_rel_error": error(gradients(dtype), reference)}


def _comparable(figure: Dict[str, Any]) -> bool:
    return all(isinstance(figure[k], float) and math.isfinite(figure[k]) and figure[k] > 0
               for k in ("predicted", "measured"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=None, help="run the setups whose name holds this text")
    parser.add_argument("--suite", default="mixed", choices=("mixed", "fp8", "scaled", "delayed"),
                        help="mixed: fp16/bf16 autocast and -full (the default); fp8: the FP8 recipes; scaled: "
                             "the FP8 and NVFP4 recipes, with the step rules judged")
    parser.add_argument("--device", default="cpu", help="where each precision's step is measured (the prediction's "
                                                         "float64 step runs on the CPU)")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    results: Dict[str, Any] = {}
    for setup in {"fp8": fp8_setups, "scaled": scaled_setups, "delayed": delayed_setups}.get(args.suite, setups)():
        if args.only and args.only not in setup["name"]:
            continue
        row = run_setup(setup, torch.device(args.device))
        results[setup["name"]] = row
        print(f"{setup['name']:48s} under {row['underflow_fraction']['predicted']:.3f}/{row['underflow_fraction']['measured']:.3f} "
              f"lost {row['lost_update_fraction']['predicted']:.3f}/{row['lost_update_fraction']['measured']:.3f} "
              f"nonfinite {row['nonfinite_updates']['predicted']}/{row['nonfinite_updates']['measured']} "
              + (f"fp8-grad {row['scaled_gradient_underflow_fraction']['predicted']:.3f}/"
                 f"{row['scaled_gradient_underflow_fraction']['measured']:.3f} " if "scaled_layers" in row else "")
              + f"{'ok' if row['agree'] and row['nonfinite_agree'] else 'MISS'} {row['findings']}", flush=True)
    rows = list(results.values())
    summary = {
        "setups": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "nonfinite_agree": sum(r["nonfinite_agree"] for r in rows),
        "clean_recipes": sum(r["clean"] for r in rows),
        "clean_recipes_with_training_findings": sum(1 for r in rows if r["clean"] and r["findings"]),
        "misses": [name for name, r in results.items() if not (r["agree"] and r["nonfinite_agree"])],
        # the step rules (PCL601, PCL602) found exactly where the measured step calls for them
        "step_rules_agree": sum(1 for r in rows if r["step_rules"]["expected"] == r["step_rules"]["found"]),
        "step_rules_expected": sum(len(r["step_rules"]["expected"]) for r in rows),
        "step_rules_disagree": [name for name, r in results.items() if r["step_rules"]["expected"] != r["step_rules"]["found"]],
        "expected_findings": sum(1 for r in rows if "expected_finding" in r),
        "expected_findings_found": sum(1 for r in rows if r.get("expected_finding")),
        # the gradient's relative error, where both figures are finite and nonzero: the rounding floor and
        # the masks (ReLU) the forward's rounding flips (reference/kinks.py)
        "grad_rel_error_compared": len(compared := [r["grad_rel_error"] for r in rows if _comparable(r["grad_rel_error"])]),
        "grad_rel_error_within_3x": sum(1 for g in compared if g["measured"] / FACTOR <= g["predicted"] <= g["measured"] * FACTOR),
        "grad_rel_error_median_ratio": sorted(g["predicted"] / g["measured"] for g in compared)[len(compared) // 2]
        if compared else None,
    }
    print(json.dumps(summary, indent=1))
    # where the gradient error beyond the rounding floor comes from: the ReLU masks the forward flips
    masks = {} if args.suite == "fp8" or args.only else {
        f"{model}/{mode}": mask_attribution(model, dtype) for model in ("mlp", "cnn")
        for mode, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16))}
    for name, figures in masks.items():
        print(f"{name:12s} ReLU inputs flipped {figures['relu_flip_fraction']} gradient error "
              f"{figures['grad_rel_error']:.2e}, masks forced {figures['masks_forced_grad_rel_error']:.2e}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(stamp({"summary": summary, "setups": results, **({"mask_attribution": masks} if masks else {})}),
                      handle, indent=1, sort_keys=False)
            handle.write("\n")


if __name__ == "__main__":
    main()
