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
pre-commit hook or CI meets it, all in one run:

  cold, 1 process     check_paths(jobs=1), empty cache: the single-core cost
  cold, N processes   check_paths on every core the run may use, empty cache
  warm (CLI)          `python -m preclint check --source-only` again, cache filled: start-up included
  --against CHECKOUT  the same CLI run from another checkout of preclint (PYTHONPATH=CHECKOUT, no
                      cache flag there): the before figure of a change, for a ratio from this run

Usage: python benchmarks/source_only.py [--files N] [--repeat R] [--no-prefilter]
       python benchmarks/source_only.py --tree torch [--against /path/to/old/checkout]
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


def _cli(root: str, env: dict, extra=()) -> tuple:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "preclint", "check", "--source-only", "--isolated", "--output-format", "json", *extra, root],
        capture_output=True, text=True, env={**os.environ, **env},
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr[-2000:])
    import json

    return seconds, len(json.loads(done.stdout)["findings"])


def tree_benchmark(root: str, against: str = "") -> None:
    """Cold and warm source-only runs over a real tree (see the module docstring)."""
    from preclint.config import Config
    from preclint.source.parallel import available_cores
    from preclint.source.run import check_paths

    if root == "torch":
        import importlib.util

        root = os.path.dirname(importlib.util.find_spec("torch").origin)
    files = sum(f.endswith(".py") for _, _, fs in os.walk(root) for f in fs)
    cores = available_cores()
    print(f"tree: {root}, {files} .py files; machine: {platform.machine()}, {cores} cores, "
          f"Python {platform.python_version()}")
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PRECLINT_CACHE_DIR"] = cache
        config = Config()
        start = time.perf_counter()
        single = check_paths([root], config, cache=False, jobs=1)
        results["cold, 1 process"] = time.perf_counter() - start
        start = time.perf_counter()
        cold = check_paths([root], config)
        results[f"cold, {cores} processes"] = time.perf_counter() - start
        assert sorted(f.sort_key() for f in cold.findings) == sorted(f.sort_key() for f in single.findings)
        results["warm (CLI)"], warm_findings = _cli(root, {"PRECLINT_CACHE_DIR": cache})
        if against:
            results["before (CLI, --against)"], before_findings = _cli(root, {"PYTHONPATH": against})
    print(f"findings: {len(cold.findings)} (warm CLI run: {warm_findings}); files parsed cold: {cold.parsed} "
          f"of {len(cold.files)} (the others hold no word a rule looks for)")
    for name, seconds in results.items():
        print(f"{name:32s} {seconds:8.2f} s   {files / seconds:8.1f} files/s")
    parallel = results[f"cold, {cores} processes"]
    print(f"cold on {cores} cores vs 1 process: {results['cold, 1 process'] / parallel:.1f}x")
    if against:
        before = results["before (CLI, --against)"]
        print(f"before: {before_findings} findings; before / cold on {cores} cores: {before / parallel:.1f}x; "
              f"before / warm: {before / results['warm (CLI)']:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-prefilter", action="store_true", help="also time TorchFix-style parsing of every file")
    parser.add_argument("--tree", help="time this directory (torch: the installed torch package) instead")
    parser.add_argument("--against", default="", help="with --tree: also time the CLI of this preclint checkout")
    args = parser.parse_args()
    if args.tree:
        tree_benchmark(args.tree, args.against)
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


if __name__ == "__main__":
    main()
