"""How fast is `preclint check --source-only` on a project-sized tree, against TorchFix's approach?

Generates 1,000 Python files (library modules, models, pytest files; about a third mention torch, a
few hold the problems preclint reports), then times, in one process and on the same tree:

  preclint        preclint.source.run.check_paths + the concise report (what the CLI does)
  preclint (CLI)  `python -m preclint check --source-only`, interpreter start-up included
  TorchFix-style  per file: read, skip files without "torch" (TorchFix's prefilter), libcst parse,
                  MetadataWrapper with QualifiedNameProvider + WhitespaceInclusivePositionProvider,
                  one visitor resolving every call's qualified name and position (TorchFix's
                  TorchVisitor does exactly this for each of its rules)
  with --no-prefilter (slow), both over every file, each parsed and checked:
  preclint, no prefilter / TorchFix-style, no prefilter

preclint's figures are the best of --repeat runs; the TorchFix-style ones run once (tens of seconds,
where run-to-run noise is small against the gap). The synthetic tree is checked without the cache.

With --tree DIR (``--tree torch``: the installed torch package) it times a real tree instead, as a
pre-commit hook or CI meets it, all in one run, back to back, each from the command line
(`python -m preclint check --source-only --output-format json`, interpreter start-up included):

  this, cold           this checkout, empty cache, on every core the run may use
  this, warm           the same again, cache filled
  LABEL, cold / warm   the same two runs by another checkout (--against LABEL=PATH, repeatable):
                       the before figures of a change, for ratios from this run
  this, cold, 1 process  (--single) check_paths(jobs=1) in this process: the single-core cost

Each run's wall and CPU seconds (workers included), the load average before and after it (the
machine may be shared), its findings and how many differ from this checkout's cold run.

Usage: python benchmarks/source_only.py [--files N] [--repeat R] [--no-prefilter]
       python benchmarks/source_only.py --tree torch [--against before=/path/to/old/checkout] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import textwrap
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402

# ---------------------------------------------------------------------------- the tree

PLAIN_FUNCTION = '''
def {name}(items, limit={limit}):
    """Return the {what} of the items, at most limit of them."""
    out = []
    for i, item in enumerate(items):
        if i >= limit:
            break
        key = str(item).strip().lower()
        if key and key not in out:
            out.append(key)
    return {{"count": len(out), "items": sorted(out), "ratio": len(out) / max(1, len(items))}}
'''

PLAIN_CLASS = '''
class {name}:
    """A small record with validation."""

    def __init__(self, path, size={limit}, tags=None):
        self.path = path
        self.size = int(size)
        self.tags = list(tags or [])

    def describe(self):
        parts = [f"{{self.path}}", f"size={{self.size}}"]
        parts.extend(f"#{{tag}}" for tag in self.tags)
        return " ".join(parts)

    def __repr__(self):
        return f"{name}({{self.path!r}}, {{self.size}})"
'''

MODEL_CLASS = '''
class {name}(nn.Module):
    def __init__(self, channels={limit}):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layers = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
        )
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layers(x) + x
        return self.head(x.mean(dim=(2, 3)))
'''

TEST_FUNCTION = '''
def test_{name}():
    torch.manual_seed({limit})
    model = {model}()
    x = torch.randn(2, 3, 16, 16)
    expected = model(x)
    actual = model(x.clone())
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert actual.shape == (2, 10)
'''

# the problems preclint reports, sprinkled over a few files
PROBLEMS = [
    '''
def test_{name}_fp16():
    model = {model}().half()
    out = model(torch.randn(2, 3, 16, 16).half())
    torch.testing.assert_close(out.float(), model.float()(torch.randn(2, 3, 16, 16)), rtol=1e-5, atol=1e-5)
''',
    '''
def train_{name}(model, loader):
    scaler = torch.cuda.amp.GradScaler()
    for x, y in loader:
        with torch.cuda.amp.autocast():
            loss = model(x).sub(y).pow(2).mean()
        scaler.scale(loss).backward()
''',
    '''
torch.backends.cuda.matmul.allow_tf32 = True
''',
    '''
def normalize_{name}(x):
    x = x.half()
    return x / (x.norm(dim=-1, keepdim=True) + 1e-8)
''',
]


def make_tree(root: str, files: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    counts = {"plain": 0, "model": 0, "test": 0, "with_problem": 0}
    for i in range(files):
        package = os.path.join(root, f"pkg{i % 20:02d}", "tests" if i % 5 == 0 else "lib")
        os.makedirs(package, exist_ok=True)
        kind = rng.choices(["plain", "model", "test"], weights=[65, 15, 20])[0]
        parts = []
        if kind == "plain":
            parts.append("import json\nimport os\nfrom dataclasses import dataclass\n")
            for j in range(rng.randint(8, 14)):
                template = PLAIN_FUNCTION if j % 3 else PLAIN_CLASS
                parts.append(template.format(name=f"item_{i}_{j}" if j % 3 else f"Record{i}x{j}",
                                             limit=rng.randint(5, 500), what=rng.choice(["keys", "names", "ids"])))
        else:
            parts.append("import torch\nimport torch.nn as nn\n")
            models = [f"Net{i}x{j}" for j in range(rng.randint(2, 4))]
            for model in models:
                parts.append(MODEL_CLASS.format(name=model, limit=rng.choice([16, 32, 64])))
            if kind == "test":
                for j in range(rng.randint(3, 6)):
                    parts.append(TEST_FUNCTION.format(name=f"{i}_{j}", limit=j, model=rng.choice(models)))
            if rng.random() < 0.15:
                parts.append(rng.choice(PROBLEMS).format(name=f"{i}", model=models[0]))
                counts["with_problem"] += 1
        counts[kind] += 1
        name = f"test_{i:04d}.py" if kind == "test" else f"module_{i:04d}.py"
        with open(os.path.join(package, name), "w") as out:
            out.write("\n".join(textwrap.dedent(p) for p in parts))
    return counts


# ---------------------------------------------------------------------------- the contenders

def run_preclint(root: str) -> int:
    from preclint.config import Config
    from preclint.report import Report, render
    from preclint.source.run import check_paths

    run = check_paths([root], Config(output_format="concise"), cache=False)
    render(Report(findings=run.findings, files=run.files), "concise")
    return len(run.findings), sum(source.parsed for source in run.sources.values())


def run_preclint_every_file(root: str) -> int:
    """preclint with its prefilter off: every file parsed, indexed and checked (the worst case, a tree
    where every file could hold a finding)."""
    import preclint.source.run as source_run

    wanted = source_run.wanted
    source_run.wanted = lambda rule, text: True
    try:
        return run_preclint(root)
    finally:
        source_run.wanted = wanted


def run_preclint_cli(root: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "preclint", "check", "--source-only", "--isolated", "--no-cache", "--output-format",
         "concise", root],
        capture_output=True, text=True,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr)
    return len(done.stdout.splitlines())


def run_torchfix_style(root: str, prefilter: bool = True) -> int:
    import libcst as cst
    from libcst.metadata import MetadataWrapper, QualifiedNameProvider, WhitespaceInclusivePositionProvider

    class Visitor(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (QualifiedNameProvider, WhitespaceInclusivePositionProvider)

        def __init__(self):
            super().__init__()
            self.calls = 0

        def visit_Call(self, node):
            names = self.get_metadata(QualifiedNameProvider, node, set())
            if names:
                self.get_metadata(WhitespaceInclusivePositionProvider, node)
                self.calls += 1

    total = parsed = 0
    for current, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(current, name), encoding="utf-8") as handle:
                text = handle.read()
            if prefilter and "torch" not in text:
                continue
            visitor = Visitor()
            MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True).visit(visitor)
            total += visitor.calls
            parsed += 1
    return parsed


def best_of(repeat: int, fn, *args) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


# runs the preclint of one checkout: its package first on the path (before the working directory),
# its rules as preclint.rules, whatever checkout the environment has installed in editable mode
_BOOTSTRAP = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv[1])
import preclint
preclint.__path__.append(sys.argv[1])
sys.argv = ["preclint"] + sys.argv[2:]
runpy.run_module("preclint", run_name="__main__", alter_sys=True)
"""


def _cpu_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cli(checkout: str, root: str, cache: str) -> dict:
    """One `preclint check --source-only` of ``root`` by ``checkout``'s preclint: wall and CPU
    seconds (the process and its workers), the load average around it, the findings."""
    import json

    load = os.getloadavg()[0]
    cpu = _cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _BOOTSTRAP, checkout, "check", "--source-only", "--isolated", "--output-format", "json", root],
        capture_output=True, text=True, env={**os.environ, "PRECLINT_CACHE_DIR": cache},
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr[-2000:])
    return {"wall_s": round(seconds, 2), "cpu_s": round(_cpu_of_children() - cpu, 2),
            "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1),
            "findings": json.loads(done.stdout)["findings"]}


def tree_benchmark(root: str, against: list, out: str = "", single: bool = False) -> None:
    """Cold and warm source-only runs over a real tree, by this checkout and by each of ``against``
    (LABEL=PATH), back to back in one run (see the module docstring)."""
    from preclint.source.parallel import available_cores

    if root == "torch":
        import importlib.util

        root = os.path.dirname(importlib.util.find_spec("torch").origin)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = [("this", here)] + [tuple(item.split("=", 1)) for item in against]
    files = sum(f.endswith(".py") for _, _, fs in os.walk(root) for f in fs)
    cores = available_cores()
    machine = {"tree": root, "py_files": files, "cores": cores, "cpu": platform.machine(),
               "python": platform.python_version()}
    print(f"tree: {root}, {files} .py files; machine: {platform.machine()}, {cores} cores, "
          f"Python {platform.python_version()}")
    results: dict = {}
    with tempfile.TemporaryDirectory() as caches:
        if single:  # the single-core cost, in this process
            from preclint.config import Config
            from preclint.source.run import check_paths

            start = time.perf_counter()
            check_paths([root], Config(), cache=False, jobs=1)
            results["this, cold, 1 process"] = {"wall_s": round(time.perf_counter() - start, 2)}
        for label, checkout in checkouts:
            cache = os.path.join(caches, label)  # empty: the first run is cold, the second warm
            for kind in ("cold", "warm"):
                results[f"{label}, {kind}"] = _cli(checkout, root, cache)
    reference = results["this, cold"]["findings"]
    for name, result in results.items():
        if "findings" in result:
            findings = result.pop("findings")
            result["findings"] = len(findings)
            result["findings_differing_from_this_cold"] = len(
                [f for f in findings if f not in reference] + [f for f in reference if f not in findings])
        wall = result["wall_s"]
        print(f"{name:26s} {wall:8.2f} s wall {result.get('cpu_s', float('nan')):8.2f} s CPU  "
              f"{files / wall:8.1f} files/s  load {result.get('load_before', '')}->{result.get('load_after', '')}  "
              f"findings {result.get('findings', '')} (differ: {result.get('findings_differing_from_this_cold', '')})")
    ratios = {}
    for label, _ in checkouts[1:]:
        for kind in ("cold", "warm"):
            before, after = results[f"{label}, {kind}"], results[f"this, {kind}"]
            ratios[f"{label} {kind} / this {kind}"] = {"wall": round(before["wall_s"] / after["wall_s"], 1),
                                                       "cpu": round(before["cpu_s"] / after["cpu_s"], 1)}
        before = results[f"{label}, cold"]
        ratios[f"{label} cold / this warm"] = {"wall": round(before["wall_s"] / results["this, warm"]["wall_s"], 1)}
    for name, ratio in ratios.items():
        print(f"{name:32s} " + "  ".join(f"{k} {v}x" for k, v in ratio.items()))
    if out:
        import json

        with open(out, "w") as handle:
            json.dump(stamp({"machine": machine, "checkouts": dict(checkouts), "runs": results, "ratios": ratios}),
                      handle, indent=1)
            handle.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-prefilter", action="store_true", help="also time TorchFix-style parsing of every file")
    parser.add_argument("--tree", help="time this directory (torch: the installed torch package) instead")
    parser.add_argument("--against", action="append", default=[], metavar="LABEL=CHECKOUT",
                        help="with --tree: also time the CLI of this preclint checkout (repeatable)")
    parser.add_argument("--single", action="store_true", help="with --tree: also time one process, in-process")
    parser.add_argument("--out", default="", help="write the figures to this JSON file")
    args = parser.parse_args()
    if args.tree:
        tree_benchmark(args.tree, args.against, args.out, args.single)
        return
    with tempfile.TemporaryDirectory() as root:
        counts = make_tree(root, args.files)
        lines = sum(sum(1 for _ in open(os.path.join(d, f))) for d, _, fs in os.walk(root) for f in fs)
        torch_files = sum(
            "torch" in open(os.path.join(d, f)).read() for d, _, fs in os.walk(root) for f in fs
        )
        print(f"tree: {args.files} files, {lines} lines, {torch_files} mention torch; {counts}")
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        findings, parsed = run_preclint(root)  # warms the imports and the OS file cache for everyone
        results = {
            "preclint": best_of(args.repeat, run_preclint, root),
            "preclint (CLI)": best_of(args.repeat, run_preclint_cli, root),
            "TorchFix-style": best_of(1, run_torchfix_style, root),
        }
        if args.no_prefilter:
            results["preclint, no prefilter"] = best_of(1, run_preclint_every_file, root)
            results["TorchFix-style, no prefilter"] = best_of(1, run_torchfix_style, root, False)
        print(f"preclint: {findings} findings, {parsed} files parsed; "
              f"TorchFix-style parses the {torch_files} that mention torch")
        for name, seconds in results.items():
            print(f"{name:32s} {seconds:7.3f} s   {seconds / args.files * 1e3:6.2f} ms/file")
        print(f"TorchFix-style / preclint: {results['TorchFix-style'] / results['preclint']:.1f}x "
              f"(CLI, start-up included: {results['TorchFix-style'] / results['preclint (CLI)']:.1f}x)")
        if args.no_prefilter:
            ratio = results["TorchFix-style, no prefilter"] / results["preclint, no prefilter"]
            print(f"every file parsed, TorchFix-style / preclint: {ratio:.1f}x")
        if args.out:
            import json

            tree = {"files": args.files, "lines": lines, "mention_torch": torch_files, "kinds": counts,
                    "findings": findings, "parsed": parsed}
            with open(args.out, "w") as handle:
                json.dump(stamp({"machine": {"cpu": platform.machine(), "cores": os.cpu_count(),
                                             "python": platform.python_version()},
                                 "tree": tree, "seconds": results}), handle, indent=1)
                handle.write("\n")


if __name__ == "__main__":
    main()
