"""Fuzzing preclint: generated model files for the graph check, mutated Python files for the
source-only check, an oracle that judges every run, a minimizer, and the long run.

- ``benchmarks.fuzz.models``: random models of torch ops, written as real model files, with a
  command line to check them (precisions, probe, output formats, several models in one run).
- ``benchmarks.fuzz.sources``: real Python files mutated (nesting, encodings, truncation, tokens,
  line endings, suppression comments) for ``--source-only``, ``--fix`` and ``--diff``.
- ``benchmarks.fuzz.oracle``: runs a case through preclint's command line and says what is wrong
  with the run, if anything (a traceback, an internal error, a signal, a hang, an invalid document,
  a user error that is not one line and exit 2, a fix that breaks or touches a file).
- ``python -m benchmarks.fuzz``: the long run, resumable, results in benchmarks/results/fuzz.json.

tests/fuzz/test_fuzz.py runs a fixed, seeded sample of the same cases.
"""
