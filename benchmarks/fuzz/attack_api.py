"""The ``api-state`` attacks of benchmarks.fuzz.attacks: a model that changes process state, checked
through the Python API (``preclint.check``), and the state read afterwards as its caller reads it.

A driver script in a fresh interpreter reads, through the public getters a user reads them with, the
working directory, ``sys.path``, the environment, the TF32 settings (the legacy getters, which raise
where torch's two APIs disagree, and the ``fp32_precision`` ones), the mode stacks, the default
device, the global module hooks and a dynamo setting; calls ``preclint.check`` on a model file that
changes one of them (at its import or in its forward), from the main thread or from another one;
reads them all again and prints what differs. Any difference is a failure (``state-kept``), and so is
a time limit that did not end a hanging forward called from another thread (``timeout-ignored``).

Every variant, at import and in forward, from the main thread and from another (the tries of the
class, without the seeds' draws), before and after a change:

    python -m benchmarks.fuzz.attack_api --label after --out benchmarks/results/fuzz_api_state.json
    python -m benchmarks.fuzz.attack_api --label before --root /tmp/before --out ...
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Optional

from benchmarks.fuzz.oracle import Checked, Verdict

VARIANTS = ("matmul-precision", "legacy-tf32", "new-tf32", "cwd", "sys-path", "environ", "function-mode",
            "dispatch-mode", "default-device", "module-hook", "dynamo-config", "thread-timeout")

# what the model does, per variant: (imports it needs, the statements)
CHANGES = {
    "matmul-precision": ("", 'torch.set_float32_matmul_precision("{precision}")'),
    "legacy-tf32": ("", "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = False"),
    "new-tf32": ("", 'torch.backends.cuda.matmul.fp32_precision = "tf32"\ntorch.backends.fp32_precision = "ieee"'),
    "cwd": ("import os", 'os.makedirs("moved", exist_ok=True)\nos.chdir("moved")'),
    "sys-path": ("import sys", 'sys.path.insert(0, "/nonexistent/api-state")\nsys.path.pop()'),
    "environ": ("import os", 'os.environ["API_STATE_ADDED"] = "1"\nos.environ.pop("API_STATE_CALLER", None)\n'
                'os.environ["PATH"] = "/nonexistent"'),
    "function-mode": ("from torch.overrides import TorchFunctionMode\n\n\n"
                      "class Passing(TorchFunctionMode):\n"
                      "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
                      "        return func(*args, **(kwargs or {}))",
                      "Passing().__enter__()"),
    "dispatch-mode": ("from torch.utils._python_dispatch import TorchDispatchMode\n\n\n"
                      "class Passing(TorchDispatchMode):\n"
                      "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
                      "        return func(*args, **(kwargs or {}))",
                      "Passing().__enter__()"),
    "default-device": ("", 'torch.set_default_device("meta")'),
    "module-hook": ("", "torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)\n"
                        "torch.nn.modules.module.register_module_forward_pre_hook(lambda m, i: None)"),
    "dynamo-config": ("import torch._dynamo.config", "torch._dynamo.config.recompile_limit = 3\n"
                      "torch._dynamo.config.suppress_errors = True"),
    "thread-timeout": ("import time", "while True:\n    time.sleep(0.01)"),
}

DRIVER = '''
import json, os, sys, threading
import torch
{preload}
import preclint

os.environ["API_STATE_CALLER"] = "the caller's"


def safe(read):
    try:
        return repr(read())
    except Exception as exc:  # what a caller meets: a getter that raises
        return "raises " + type(exc).__name__


def readings():
    from torch.nn.modules import module
    backends = torch.backends
    dynamo = sys.modules.get("torch._dynamo.config")
    return {{
        "cwd": safe(os.getcwd), "sys.path": safe(lambda: list(sys.path)),
        "environ": safe(lambda: sorted(os.environ.items())),
        "get_float32_matmul_precision": safe(torch.get_float32_matmul_precision),
        "cuda.matmul.allow_tf32": safe(lambda: backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": safe(lambda: backends.cudnn.allow_tf32),
        "fp32_precision": safe(lambda: [getattr(o, "fp32_precision", None) for o in (
            backends, backends.cuda.matmul, backends.cudnn.conv, backends.mkldnn.matmul)]),
        "function modes": safe(torch._C._len_torch_function_stack),
        "dispatch modes": safe(torch._C._len_torch_dispatch_stack),
        "default device": safe(lambda: torch.zeros(1).device),
        "module hooks": safe(lambda: {{n: len(v) for n, v in vars(module).items()
                                      if n.startswith("_global_") and isinstance(v, dict)}}),
        "dynamo": safe(lambda: (dynamo.recompile_limit, dynamo.suppress_errors) if dynamo else None),
    }}


def dynamo_defaults():
    # (a config module first loaded during the call must read its defaults afterwards)
    entries = sys.modules["torch._dynamo.config"]._config
    return repr((entries["recompile_limit"].default, entries["suppress_errors"].default))


before = readings()
outcome = []


def call():
    try:
        preclint.check("m.py", precisions=("tf32",), timeout={timeout})
        outcome.append("ok")
    except preclint.UserError as exc:
        outcome.append("UserError: " + str(exc))
    except Exception as exc:  # (not this class's failure: the state must come back all the same)
        outcome.append(type(exc).__name__ + ": " + str(exc))


if {thread}:
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join({join})
    if worker.is_alive():
        outcome.append("hung")
else:
    call()
after = readings()
if before["dynamo"] == "None" and after["dynamo"] != "None":
    before["dynamo"] = dynamo_defaults()
print(json.dumps({{"outcome": outcome[0] if outcome else "none",
                  "changed": {{k: [before[k], after[k]] for k in before if before[k] != after[k]}}}}))
sys.stdout.flush()
os._exit(0)  # (a hung worker thread must not hold the interpreter)
'''

TIMEOUT = 3.0  # the time limit of a thread-timeout case's check


def model_file(variant: str, where: str, precision: str) -> str:
    imports, statements = CHANGES[variant]
    statements = statements.format(precision=precision)
    at_import = statements if where == "import" else ""
    in_forward = statements if where == "forward" else ""
    body = textwrap.indent(in_forward + "\nreturn self.fc(x)" if in_forward else "return self.fc(x)", " " * 8)
    return (f"import torch\nfrom torch import nn\n{imports}\n\n{at_import}\n\n\n"
            "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n{body}\n\n\n"
            "example_inputs = (torch.randn(2, 4),)\n")


def api_state(case, directory: str, root: Optional[str] = None) -> Checked:
    """Check one case; ``root``: the checkout whose preclint is checked (this one by default)."""
    from benchmarks.fuzz.attack_oracle import ROOT
    from benchmarks.fuzz.attacks import GRAPH_TIMEOUT, write

    variant, where = case.variant, str(case.params["where"])
    if variant == "thread-timeout":
        where = "forward"  # (a hang at import is the same limit, but slower to reach)
    write(directory, "m.py", model_file(variant, where, str(case.params.get("precision", "high"))))
    thread = variant == "thread-timeout" or bool(case.params["thread"])
    driver = DRIVER.format(preload="import torch._dynamo.config" if case.params.get("preload") else "",
                           timeout=TIMEOUT if variant == "thread-timeout" else 0, thread=thread,
                           join=GRAPH_TIMEOUT / 2)
    write(directory, "driver.py", driver)
    env = {"PYTHONPATH": root or str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": directory}
    try:
        done = subprocess.run([sys.executable, "driver.py"], cwd=directory, capture_output=True, text=True,
                              timeout=GRAPH_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return Checked(Verdict("hang", f"the API driver ran past {GRAPH_TIMEOUT:g} s"))
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " ".join(done.stderr.strip().splitlines()[-1:])
        return Checked(Verdict("crash", f"the API driver printed no result (exit {done.returncode}): {tail}"))
    if result["outcome"] == "hung":
        return Checked(Verdict("timeout-ignored", f"timeout={TIMEOUT:g} did not end a hanging forward called "
                               "from another thread"), extra=result)
    if variant == "thread-timeout" and "gave up after" not in result["outcome"]:
        return Checked(Verdict("timeout-ignored", f"expected the time limit's error, got {result['outcome'][:120]}"),
                       extra=result)
    if result["changed"]:
        names = ", ".join(sorted(result["changed"]))
        return Checked(Verdict("state-kept", f"preclint.check left changed ({where}, "
                               f"{'thread' if thread else 'main thread'}): {names}"), extra=result)
    return Checked(Verdict(), extra=result)


def sweep(root: Optional[str]) -> list:
    """Each (variant, where, thread) once: the rows of the summary."""
    from benchmarks.fuzz.attacks import AttackCase

    rows = []
    for variant, where, thread in itertools.product(VARIANTS, ("import", "forward"), (False, True)):
        if variant == "thread-timeout" and (where == "import" or not thread):
            continue  # (always a forward, from another thread)
        params = {"where": where, "thread": thread, "precision": "high", "preload": variant == "dynamo-config"
                  and where == "forward"}
        with tempfile.TemporaryDirectory() as directory:
            checked = api_state(AttackCase(f"api-{variant}-{where}-{thread}", "api-state", variant, params),
                                directory, root)
        rows.append({"variant": variant, "where": where, "thread": thread, "failure": checked.verdict.failure,
                     "detail": checked.verdict.detail, "outcome": str(checked.extra.get("outcome", ""))[:200]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    from benchmarks.provenance import stamp, store_labelled

    parser = argparse.ArgumentParser(description="every api-state attack, once")
    parser.add_argument("--label", required=True, help="the key the results are kept under (before, after)")
    parser.add_argument("--root", help="the checkout whose preclint is checked (default: this one)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = sweep(os.path.abspath(args.root) if args.root else None)
    failures: dict = {}
    for row in rows:
        if row["failure"]:
            failures[row["failure"]] = failures.get(row["failure"], 0) + 1
    store_labelled(args.out, args.label, stamp({"root": args.root or ".", "tries": len(rows),
                                                "failed": sum(failures.values()), "failures": failures, "cases": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
