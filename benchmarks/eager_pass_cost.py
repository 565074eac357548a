"""Benchmark: what one eager pass of a model FX cannot trace costs per op, layer by layer of the work.

    python benchmarks/eager_pass_cost.py --size narrow --device cpu --out FILE   # a 7B's graph, CPU width
    python benchmarks/eager_pass_cost.py --size 1b --device cuda --out FILE

transformers' Llama runs eagerly under the probe (capture/recorder.py): every pass of the check and
the probe runs the model's Python with a TorchFunctionMode and module hooks that record each op.
Here, on a Llama-shaped model from benchmarks/large_models.py, the least of ``--repeat`` runs of:

* ``forward``: the model itself, no autograd;
* ``function_mode``: the same under a TorchFunctionMode that only calls each function;
* ``module_hooks``: and a forward pre- and post-hook on every module that do nothing;
* ``recorder``: capture's recorder with an observer that does nothing (``locate=False``, as the
  probe's passes run it; ``recorder_located``: as the check's capture, finding each op's line);
* ``tape_replay``: the floor of replaying one recording instead of recording again: the calls the
  recorder saw (each leaf module and top-level function, with its arguments, the tensors among them
  looked up by the op that made them) run again in order, without the model's Python, no observer
  and no check that the recording still holds (``replay_floor_saves_per_pass_us``: recorder minus
  this, per op);
* each stage of one probe of the model (its ``stages_s``, the second of two probes).

Each figure also per recorded op (microseconds): what torch's dispatch to Python costs
(``function_mode`` - ``forward``), what the recorder's own Python adds, and what the observers of
the probe's passes add over that. Where those per-op costs dominate, the probe's ratio to the bare
work does not shrink with the GPU's work (benchmarks/README.md, "Large models").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.large_models import MODES, SIZES, build, probe, sync  # noqa: E402
from benchmarks.provenance import stamp, write_stamped  # noqa: E402
from preclint.capture.observer import Observer  # noqa: E402
from preclint.capture.recorder import capture_function_mode  # noqa: E402
from preclint.capture.trees import flatten, leaves  # noqa: E402


class _NothingObserved(Observer):
    def __call__(self, node, args, kwargs, callee, output):
        return output


class _CallsOnly(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Tape(Observer):
    """Each call of one recorded run, as the recorder hands it over: (node, args, kwargs, callee, output)."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, node, args, kwargs, callee, output):
        self.calls.append((node, args, kwargs, callee, output))
        return output


def tape_of(model, ids) -> Callable[[], None]:
    """A replay of one recorded run of ``model`` on ``ids``: its calls again, each tensor argument
    taken from the output of the call that made it in this replay (parameters, buffers and inputs
    as they are)."""
    tape = _Tape()
    capture_function_mode(model, (ids,), tape, locate=False)
    made = {}  # id(tensor) -> (call, output index)
    program = []
    for i, (node, args, kwargs, callee, output) in enumerate(tape.calls):
        outs = leaves(output)
        if node.kind != "input":
            flat, rebuild = flatten(args, kwargs)
            refs = [made.get(id(v)) if isinstance(v, torch.Tensor) else None for v in flat]
            program.append((i, callee, [None if r is not None else v for r, v in zip(refs, flat)], refs, rebuild))
        for j, t in enumerate(outs):
            if isinstance(t, torch.Tensor):
                made[id(t)] = (i, j)
    first = tape.calls[0][0].kind == "input"
    del tape

    def replay():
        env = {0: [ids]} if first else {}
        for i, callee, flat, refs, rebuild in program:
            args, kwargs = rebuild([env[r[0]][r[1]] if r is not None else v for r, v in zip(refs, flat)])
            env[i] = leaves(callee(*args, **kwargs))

    return replay


def least(run: Callable[[], None], device, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def measure(size: str, device: torch.device, repeat: int) -> Dict[str, object]:
    model, ids = build(size, device)

    def forward():
        model(ids)

    def function_mode():
        with _CallsOnly():
            model(ids)

    def module_hooks():
        handles = []
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(lambda module, args, kwargs: None, with_kwargs=True))
            handles.append(m.register_forward_hook(lambda module, args, kwargs, output: None, with_kwargs=True))
        try:
            function_mode()
        finally:
            for h in handles:
                h.remove()

    with torch.no_grad():
        forward()  # the libraries and kernels loaded before anything is timed
        seconds = {
            "forward": least(forward, device, repeat),
            "function_mode": least(function_mode, device, repeat),
            "module_hooks": least(module_hooks, device, repeat),
            "recorder": least(lambda: capture_function_mode(model, (ids,), _NothingObserved(), locate=False), device, repeat),
            "recorder_located": least(lambda: capture_function_mode(model, (ids,), _NothingObserved()), device, repeat),
            "tape_replay": least(tape_of(model, ids), device, repeat),
        }
        ops = len(capture_function_mode(model, (ids,), _NothingObserved(), locate=False)[0])
    for _ in range(2):  # the second probe: the first pays for what it loads
        _report, result, check_s, probe_s = probe(model, ids, device, MODES, False)
    stages = dict(result.timings)
    per_op = {name: 1e6 * s / ops for name, s in seconds.items()}
    return {
        "size": size, "device": str(device), "tokens": int(ids.shape[1]), "ops": ops, "seconds": seconds,
        "per_op_us": per_op,
        "dispatch_per_op_us": per_op["function_mode"] - per_op["forward"],
        "hooks_per_op_us": per_op["module_hooks"] - per_op["function_mode"],
        "recorder_own_per_op_us": per_op["recorder"] - per_op["module_hooks"],
        "replay_floor_saves_per_pass_us": per_op["recorder"] - per_op["tape_replay"],
        "check_s": check_s, "probe_s": probe_s, "stages_s": stages,
        "stages_per_op_us": {name: 1e6 * s / ops for name, s in stages.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="narrow")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    parser.add_argument("--threads", type=int, help="torch's CPU threads")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = stamp(measure(args.size, torch.device(args.device), args.repeat))
    write_stamped(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
