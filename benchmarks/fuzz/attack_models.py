"""The attacks of benchmarks.fuzz.attacks that need a model run: hostile checkpoints for ``--weights``,
model files that leave processes behind, and models whose forward is not deterministic.

- ``checkpoint``: a state dict saved by ``torch.save`` is re-zipped (every entry deflated, only the
  tensors' data deflated, or stored again without torch's alignment): the findings must be the
  original's (or the file refused, exit 2). A zip bomb (a tensor's record that inflates to hundreds
  of MB), a truncated zip, a zip whose headers lie about a record's size, a pickle that runs code and
  safetensors files with offsets past the end, a header length of a terabyte or a dtype that does not
  fit the bytes must be refused: exit 2, one line, within the time and memory limits, no code run.
- ``fork``: the model file starts a process (os.fork at import or in forward, subprocess.Popen,
  multiprocessing, a double-forked daemon) that sleeps holding stdout and writes its pid to a file:
  the run's stdout must close when preclint ends (``preclint check m.py | cat`` must not wait) and no
  such process may outlive the run. The processes are killed afterwards, by their pids.
- ``nondeterministic``: a forward that adds noise, drops out in eval mode, or changes with each call:
  a probe that measures it must say that the model is not deterministic (the words "determin" or
  "run-to-run" anywhere in its output), not report the noise as precision error alone.
"""
from __future__ import annotations

import os
import signal
import struct
import time
import zipfile
from typing import Dict

from benchmarks.fuzz.attack_oracle import judge_attack, kill_group
from benchmarks.fuzz.oracle import Checked, Verdict

SLEEP = 20  # seconds a model's child process sleeps, holding stdout


def plain_model(forward: str = "return self.fc(x * 1e5)", top: str = "", init: str = "") -> str:
    """A model ``Net`` with one ``fc = nn.Linear(4, 4)``; its forward overflows float16 by default."""
    return ("import torch\nimport torch.nn.functional as F\nfrom torch import nn\n" + top + "\n\n"
            "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(4, 4)\n" + init + "\n"
            "    def forward(self, x):\n" + "".join(f"        {line}\n" for line in forward.splitlines()) + "\n\n"
            "model = Net()\nexample_inputs = (torch.randn(2, 4),)\n")


def save_weights(path: str, scale: float, seed: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {"fc.weight": torch.randn(4, 4, generator=generator) * scale,
             "fc.bias": torch.randn(4, generator=generator)}
    torch.save(state, path)
    return state


# ------------------------------------------------------------------------------------ checkpoints


def rezip(source: str, target: str, deflate_all: bool, deflate_data: bool) -> None:
    """``source`` (a torch.save zip) written again by zipfile, the records deflated as asked; a
    record stored again loses torch's 64-byte alignment of the data."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            compress = deflate_all or (deflate_data and "/data/" in info.filename)
            dst.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED)


def zip_bomb(source: str, target: str, megabytes: int = 384) -> None:
    """``source`` with its first tensor's record replaced by ``megabytes`` MB of zeros, deflated (a
    few hundred KB in the file), written in chunks (the harness never holds them)."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        bombed = False
        for info in src.infolist():
            if "/data/" in info.filename and not bombed:
                bombed = True
                record = zipfile.ZipInfo(info.filename)
                record.compress_type = zipfile.ZIP_DEFLATED
                chunk = bytes(1 << 20)
                with dst.open(record, "w", force_zip64=True) as out:
                    out.write(src.read(info.filename))
                    for _ in range(megabytes):
                        out.write(chunk)
            else:
                dst.writestr(info, src.read(info.filename))


def lie_about_size(path: str) -> None:
    """Multiply the uncompressed size a data record's local and central headers give by 1000."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for signature, offset, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        at = data.find(signature)
        while at != -1:
            name_length = struct.unpack_from("<H", data, at + (26 if signature == b"PK\x03\x04" else 28))[0]
            name = bytes(data[at + name_at:at + name_at + name_length])
            if b"/data/" in name:
                (size,) = struct.unpack_from("<I", data, at + offset)
                struct.pack_into("<I", data, at + offset, min(size * 1000, 0xFFFFFFFE))
            at = data.find(signature, at + 4)
    with open(path, "wb") as f:
        f.write(bytes(data))


def safetensors(path: str, state: dict, variant: str) -> None:
    import json

    header, blobs, offset = {}, [], 0
    for name, tensor in state.items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    first = next(iter(header))
    if variant == "safetensors-offsets":
        header[first]["data_offsets"] = [0, 10 ** 12]
    elif variant == "safetensors-dtype":
        header[first]["dtype"] = "F64"
    text = json.dumps(header).encode()
    length = 1 << 40 if variant == "safetensors-header" else len(text)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", length) + text + b"".join(blobs))


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def checkpoint(case, directory: str) -> Checked:
    from benchmarks.fuzz.attacks import findings_of, run, write

    import torch

    variant = case.variant
    write(directory, "m.py", plain_model("return self.fc(x)"))
    original = os.path.join(directory, "orig.pt")
    state = save_weights(original, float(case.params["scale"]), int(case.params["seed"]))
    hostile = os.path.join(directory, "hostile.pt")
    pwned = os.path.join(directory, "pwned")
    if variant in ("deflate", "deflate-data", "restored"):
        rezip(original, hostile, variant == "deflate", variant == "deflate-data")
    elif variant == "bomb":
        zip_bomb(original, hostile)
    elif variant == "truncated":
        with open(original, "rb") as f:
            data = f.read()
        with open(hostile, "wb") as f:
            f.write(data[:len(data) * 2 // 3])
    elif variant == "lying-size":
        rezip(original, hostile, False, False)
        lie_about_size(hostile)
    elif variant == "code":
        torch.save({"fc.weight": _RunsCode(pwned), "fc.bias": state["fc.bias"]}, hostile)
    else:
        hostile = os.path.join(directory, "hostile.safetensors")
        safetensors(hostile, state, variant)
    healthy = variant in ("deflate", "deflate-data", "restored", "safetensors")
    argv = ["check", "m.py", "--weights", os.path.basename(hostile), "--output-format", "json"]
    result = run(argv, directory)
    verdict = judge_attack(result, argv, {0, 1, 2})
    if verdict.ok and os.path.exists(pwned):
        verdict = Verdict("code-ran", "loading the weights ran the pickle's code")
    if verdict.ok and result.rc != 2 and not (healthy or variant == "lying-size"):
        verdict = Verdict("accepted-hostile", f"a {variant} checkpoint was read (exit {result.rc}), not refused")
    if verdict.ok and result.rc != 2 and (healthy or variant == "lying-size"):
        truth_argv = ["check", "m.py", "--weights", "orig.pt", "--output-format", "json"]
        truth = run(truth_argv, directory)
        if truth.rc in (0, 1) and findings_of(truth.stdout) != findings_of(result.stdout):
            got, want = findings_of(result.stdout) or [], findings_of(truth.stdout) or []
            verdict = Verdict("misread-weights", f"{len(got)} findings ({', '.join(sorted({f[0] for f in got})) or 'none'}) "
                              f"where the original checkpoint gives {len(want)}")
    return Checked(verdict, result)


# ------------------------------------------------------------------------------------ processes left behind

def fork_model(variant: str, pids: str, sleep: int = SLEEP) -> str:
    """The model file of a ``fork`` variant: its child appends its pid to ``pids`` and sleeps."""
    record = f"open({pids!r}, 'a').write(f'{{os.getpid()}} {{time.time()}}\\n')"
    child = f"{record}\ntime.sleep({sleep})"
    if variant == "import-fork":
        top = "import os, time\nif os.fork() == 0:\n" + _indent(child + "\nos._exit(0)", 4)
        return plain_model("return self.fc(x)", top="\n" + top)
    if variant == "forward-fork":
        forward = "if not _FORKED:\n    _FORKED.append(1)\n    if os.fork() == 0:\n" + _indent(child + "\nos._exit(0)", 8)
        return plain_model(forward + "return self.fc(x)", top="\nimport os, time\n_FORKED = []\n")
    if variant == "popen":
        code = f"import os, time\n{child}\n"
        return plain_model("return self.fc(x)", top=f"\nimport subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {code!r}])\n")
    if variant == "multiprocessing":
        top = ("import multiprocessing, os, time\n\n\ndef _sleeper():\n" + _indent(child, 4)
               + "\n\n\nmultiprocessing.get_context('fork').Process(target=_sleeper).start()\n")
        return plain_model("return self.fc(x)", top="\n" + top)
    # daemon: forked twice, in a session of its own
    top = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n" + _indent(child, 8) + "\n    os._exit(0)\n"
    return plain_model("return self.fc(x)", top="\n" + top)


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def fork(case, directory: str) -> Checked:
    from benchmarks.fuzz.attacks import run, write

    pids_file = os.path.join(directory, "pids.txt")
    write(directory, "m.py", fork_model(case.variant, pids_file))
    argv = ["check", "m.py", "--output-format", "concise"]
    result = run(argv, directory, end_group=False)  # in CI nobody ends what a run leaves behind
    ended = time.time()
    time.sleep(1.0)  # the run's own clean-up of what the model started, if it makes one
    started = _pids(pids_file)
    pids = sorted(started)
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:  # the model's processes, started by this case: ours to end
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_group(result.pid)
    verdict = judge_attack(result, argv, {0, 1})
    if verdict.ok and any(ended - result.held_open >= start + SLEEP - 1 for start in started.values()):
        verdict = Verdict("held-stdout", f"the run ended only when the model's child did ({result.seconds:.0f} s)")
    if verdict.ok and survivors:
        verdict = Verdict("survivor", f"{len(survivors)} of the {len(pids)} processes the model started outlived the run")
    return Checked(verdict, result, extra={"pids": pids})


def _pids(path: str) -> Dict[int, float]:
    """The pids the model's processes wrote, and when each started (time.time())."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f.read().splitlines()]
    except OSError:
        return {}
    return {int(row[0]): float(row[1]) for row in rows if len(row) == 2 and row[0].isdigit()}


# ------------------------------------------------------------------------------------ nondeterminism

NOISY = {
    "rand": "return self.fc(x) + torch.rand_like(x) * {noise}",
    "dropout": "return self.fc(F.dropout(x, 0.5, training=True)) * {noise} + self.fc(x)",
    "counter": "self.calls += 1\nreturn self.fc(x) * (1 + {noise} * self.calls)",
    "bernoulli": "return self.fc(x) * (1 + {noise} * torch.bernoulli(torch.full_like(x, 0.5)))",
}


def nondeterministic(case, directory: str) -> Checked:
    from benchmarks.fuzz.attacks import run, write

    noise = float(case.params["noise"])
    write(directory, "m.py", plain_model(NOISY[case.variant].format(noise=noise), init="        self.calls = 0\n"))
    fmt = str(case.params["format"])
    if case.params["command"] == "probe":
        argv = ["probe", "m.py", "--device", "cpu"]
    else:
        argv = ["check", "m.py", "--probe", "cpu"]
    argv += ["--rtol", "1e-3", "--atol", "1e-5", "--output-format", fmt]
    result = run(argv, directory)
    verdict = judge_attack(result, argv, {0, 1})
    said = (_prose(result.stdout, fmt) + result.stderr).lower()
    if verdict.ok and "determin" not in said and "run-to-run" not in said:
        verdict = Verdict("missing-note", f"a forward that is not deterministic ({case.variant}, {noise:g}) was probed "
                          "and nothing says so")
    return Checked(verdict, result)


def _prose(stdout: str, fmt: str) -> str:
    """What a report says in words: a json report's strings, less its environment (which names the
    flags ``torch.backends.cudnn.deterministic`` and ``are_deterministic_algorithms_enabled``)."""
    if fmt != "json":
        return stdout
    import json

    from benchmarks.fuzz.attack_oracle import strings

    try:
        doc = json.loads(stdout)
    except ValueError:
        return stdout
    reports = doc if isinstance(doc, list) else [doc]
    return "\n".join(s for r in reports if isinstance(r, dict)
                     for s in strings({k: v for k, v in r.items() if k != "environment"}))
