"""Tries of the fuzzer's ``answers`` class (benchmarks/fuzz/attack_answers.py: broken checkpoints in
``diff``, activations whose squares overflow float32, an amax floor that zeroes the GEMMs, lossy
checkpoint casts), each variant with its own seeds, against a checkout of preclint (``--root``):

    python benchmarks/fuzz_answers.py --tries 5 --label after --out benchmarks/results/fuzz_answers.json
    python benchmarks/fuzz_answers.py --tries 5 --label before --root ../main --out benchmarks/results/fuzz_answers.json

Each label's runs are kept beside the others' in ``--out``: per variant the tries, the failures and
their details, and a summary line per label. (The train-mode verdicts of ``pytest --preclint`` are
tests/testing's: the fuzzer runs preclint's command line only.)
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import attack_oracle  # noqa: E402
from benchmarks.fuzz.attack_answers import VARIANTS, answers, params  # noqa: E402
from benchmarks.fuzz.attacks import AttackCase  # noqa: E402
from benchmarks.provenance import git_commit, store_labelled  # noqa: E402


def try_variants(tries: int, first: int) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    for variant in VARIANTS:
        row: Dict[str, Any] = {"tries": 0, "failures": 0, "details": []}
        for seed in range(first, first + tries):
            rng = random.Random(f"answers-{variant}-{seed}")
            case = AttackCase(f"answers-{variant}-{seed}", "answers", variant, {"seed": seed, **params(rng, variant)})
            with tempfile.TemporaryDirectory() as directory:
                checked = answers(case, directory)
            row["tries"] += 1
            if not checked.verdict.ok:
                row["failures"] += 1
                row["details"].append({"seed": seed, "params": case.params, "failure": checked.verdict.failure,
                                       "detail": checked.verdict.detail[:300]})
            print(f"{case.name}: {'ok' if checked.verdict.ok else checked.verdict.failure}", flush=True)
        found[variant] = row
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=5, help="seeds per variant")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout of preclint the runs import")
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    attack_oracle.ROOT = args.root.resolve()  # the PYTHONPATH of each run
    variants = try_variants(args.tries, args.first)
    tries = sum(v["tries"] for v in variants.values())
    held = tries - sum(v["failures"] for v in variants.values())
    store_labelled(args.out, args.label, {"root_commit": git_commit(args.root.resolve()), "variants": variants,
                                          "summary": f"{held}/{tries} answered true"})
    print(f"{args.label}: {held}/{tries} answered true")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
