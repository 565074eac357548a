"""The attack family of the fuzzer (benchmarks/fuzz/attacks.py): a fixed, seeded sample of ``attack-SEED``
cases, each judged by the attack oracle, and the oracle itself on planted failures (a workflow command,
an ESC, a live link, an unencoded URI, a hang, a blow-up...), which it must see.

Every class the long run found failing (benchmarks/results/fuzz_attacks.json, before the CI-trust
fixes) must pass here.
``PRECLINT_FUZZ_N=K`` takes K times as many cases of each class; ``python -m benchmarks.fuzz --attacks
N`` is the long run (benchmarks/results/fuzz_attacks.json).
"""
from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

from benchmarks.fuzz import cases
from benchmarks.fuzz.attack_oracle import (LimitedRun, control_problem, html_problem, injection_problem,
                                           judge_attack, markup_problem, run_limited, sarif_uri_problem)
from benchmarks.fuzz.attack_files import growth_verdict
from benchmarks.fuzz.attacks import CLASSES, PAYLOADS, attack_case, digest, findings_of

SCALE = max(1, int(os.environ.get("PRECLINT_FUZZ_N", "1")))



def _sample(per_class: int, variants_per_class: int = 3):
    """The first seeds of each class, preferring variants not yet taken (cheap: a case is only draws)."""
    taken = {attack: [] for attack in CLASSES}
    want = {attack: per_class * (2 if attack == "names" else 1) for attack in CLASSES}
    for seed in range(5000):
        case = attack_case(seed)
        chosen = taken[case.attack]
        if len(chosen) >= want[case.attack]:
            continue
        seen = {c.variant for c in chosen}
        if case.variant in seen and len(seen) < min(variants_per_class, len(CLASSES[case.attack][1])):
            continue
        chosen.append(case)
        if all(len(taken[a]) >= want[a] for a in CLASSES):
            break
    return [c for attack in sorted(taken) for c in taken[attack]]


def _param(case):
    return pytest.param(case.name, id=f"{case.name}-{case.attack}-{case.variant}")


@pytest.mark.slow
@pytest.mark.parametrize("name", [_param(c) for c in _sample(2 * SCALE)])
def test_attack(name, tmp_path):
    checked = cases.check(cases.build(name), str(tmp_path))
    v, run = checked.verdict, checked.run
    tail = f"\nexit {run.rc}\nstderr: {run.stderr[-1500:]!r}\nstdout: {run.stdout[-800:]!r}" if run else ""
    assert v.ok, f"{name}: {v.failure}: {v.detail}{tail}"


def test_attack_cases_are_reproducible_and_reach_every_variant():
    assert attack_case(17) == attack_case(17)
    drawn = {(c.attack, c.variant) for c in map(attack_case, range(1500))}
    assert drawn == {(a, v) for a, (_, variants) in CLASSES.items() for v in variants}


# ------------------------------------------------------------------ the oracle on planted failures


def _run(stdout="", stderr="", rc=1, **kw) -> LimitedRun:
    return LimitedRun(rc, stdout, stderr, 0.5, memory_mb=2048, **kw)


ANNOTATION = ("::warning file=proj/a%0A%3A%3Aerror%3A%3AINJ00.py,line=5,col=5,title=preclint (PCL503)::"
              "proj/a%0A::error::INJ00.py:5:5: PCL503 deprecated.%0A  help: 100%25 fixed")


@pytest.mark.parametrize("fmt, stdout, stderr", [
    ("concise", "a.py:1:1: PCL503 x\n::error::x\n", ""),
    ("full", "  ::stop-commands::token\n", ""),
    ("concise", "a.py:1:1: PCL503 x\r::warning::x\n", ""),  # the runner ends a line at CR too
    ("concise", "##[error]legacy\n", ""),
    ("github", "::error::injected, no title\n", ""),
    ("github", "::warning file=a:b.py,line=1,col=1,title=preclint (PCL503)::m\n", ""),  # ':' unescaped in a property
    ("github", "::warning file=a.py,line=1,col=1,title=preclint (PCL503)::50% done\n", ""),  # '%' unescaped
    ("github", "::add-mask::secret\n", ""),
    ("json", "{}\n", "preclint: error: m.py: ValueError: a\n::error::x\n"),
    ("github", "", "::error title=preclint::never on stderr\n"),
])
def test_the_oracle_sees_a_workflow_command(fmt, stdout, stderr):
    argv = ["check", "m.py", "--output-format", fmt]
    verdict = judge_attack(_run(stdout, stderr), argv, {0, 1, 2})
    assert verdict.failure == "injection", verdict


def test_the_oracle_sees_a_name_that_mimics_preclints_own_annotation():
    payload = "a\n::error title=preclint::INJ03"
    line = "::error title=preclint::INJ03.py:5:5: PCL503 deprecated."
    assert injection_problem(line + "\n", "stdout", "github") is None  # well formed, on its own...
    assert injection_problem(line + "\n", "stdout", "github", [payload])  # ...but it is where a name's second line begins


def test_the_oracle_passes_preclints_own_annotations():
    stdout = ANNOTATION + "\n::notice title=preclint::2 more findings not shown as annotations\nplain.py:1:1: PCL503 x\n"
    argv = ["check", "--source-only", "proj", "--output-format", "github"]
    assert judge_attack(_run(stdout), argv, {1}, payloads=["a\n::error::INJ00"]).ok


@pytest.mark.parametrize("text", ["\x1b[31mred", "\x1b]8;;https://evil/\x07x", "\x9b31m", "x\u202ey", "a\x85b", "a\rb", "\x7f"])
def test_the_oracle_sees_a_raw_control_character(text):
    assert control_problem(f"m.py:1:1: PCL101 blocks.{text} overflows\n", "stdout")
    argv = ["check", "m.py", "--output-format", "concise"]
    assert judge_attack(_run(f"m.py:1:1: PCL101 blocks.{text} overflows\n"), argv, {1}).failure == "control-chars"


def test_the_oracle_reads_controls_in_documents_as_data_but_not_on_stderr():
    argv = ["check", "m.py", "--output-format", "rdjson"]
    doc = json.dumps({"diagnostics": [{"message": "blocks.\x1b[31m", "location": {"path": "m.py"}}]}, ensure_ascii=False)
    assert judge_attack(_run(doc), argv, {1}).ok
    assert judge_attack(_run(doc, "warning: blocks.\x1b[31m\n"), argv, {1}).failure == "control-chars"
    assert control_problem("tab\tand newline\n", "stdout") is None


@pytest.mark.parametrize("payload, printed", [
    ("[bold]INJ15[/bold]", "blocks.INJ15 overflows"),
    (":smile:INJ18", "blocks.\U0001F604INJ18 overflows"),
    ("[md](https://evil/INJ17)", "blocks.md overflows"),  # the marker gone with the markup
])
def test_the_oracle_sees_console_markup_eaten(payload, printed):
    marker = payload[payload.index("INJ"):payload.index("INJ") + 5]
    assert markup_problem(printed, [(payload, marker)])
    assert markup_problem(f"blocks.{payload} overflows", [(payload, marker)]) is None


def _page(body: str, data=None) -> str:
    data_json = json.dumps(data or {"nodes": {"labels": ["fc"]}}).replace("</", "<\\/")
    return (f"<!DOCTYPE html><html><head><script>var Plotly = {{}};</script></head><body>{body}"
            f"<a href='#' class='show-node' data-anchor='m0-f0'>show on the chart</a>"
            f"<script type='application/json' class='report-data'>{data_json}</script></body></html>")


@pytest.mark.parametrize("page", [
    _page('<p>blocks.<a href="https://evil/INJ19">x</a></p>'),
    _page("<p>blocks.<img src=x onerror=INJ21()></p>"),
    _page("<p>blocks.</p><script>INJ20()</script>"),
    _page("<p>ok</p>", {"nodes": {"labels": ['blocks.<a href="https://evil/INJ19">x</a>']}}),  # plotly draws the link
])
def test_the_oracle_sees_live_html(page):
    assert html_problem(page, ["INJ19", "INJ20", "INJ21"])
    argv = ["check", "m.py", "--output-format", "html", "-o", "report.html"]
    assert judge_attack(_run(), argv, {1}, html=page, markers=["INJ19", "INJ20", "INJ21"]).failure == "live-html"


def test_the_oracle_passes_escaped_html():
    escaped = '&lt;a href=&quot;https://evil/INJ19&quot;&gt;x&lt;/a&gt;'
    page = _page(f"<p>blocks.{escaped}</p><div data-module='{escaped}'></div>",
                 {"nodes": {"labels": [f"blocks.{escaped}"], "modules": ["blocks.&lt;script&gt;INJ20()"]}})
    assert html_problem(page, ["INJ19", "INJ20"]) is None


def test_the_oracle_sees_an_unencoded_sarif_uri():
    def log(uri):
        return json.dumps({"runs": [{"results": [{"locations": [{"physicalLocation": {"artifactLocation": {"uri": uri}}}]}]}]})

    assert sarif_uri_problem(log("proj/a b#c?.py"))
    assert sarif_uri_problem(log("proj/a\n::error::x.py"))
    assert sarif_uri_problem(log("proj/\u00fc.py"))
    assert sarif_uri_problem(log("proj/a%20b%23c%3F%0A%C3%BC.py")) is None


def test_the_oracle_sees_a_hang_a_blow_up_a_held_stdout_a_crash_and_a_wrong_exit():
    argv = ["check", "m.py", "--output-format", "concise"]
    assert judge_attack(LimitedRun(None, "", "", 30.0), argv, {1}).failure == "hang"
    assert judge_attack(_run(rc=-signal.SIGABRT, stderr="terminate called after throwing an instance of "
                             "'std::bad_alloc'\n"), argv, {1}).failure == "memory"
    assert judge_attack(_run(max_rss_mb=1900.0), argv, {1}).failure == "memory"
    assert judge_attack(_run(held_open=3.0), argv, {1}).failure == "held-stdout"
    internal = "preclint: internal error: RecursionError: maximum recursion depth exceeded (run with --debug)\n"
    assert judge_attack(_run(rc=2, stderr=internal), argv, {0, 1, 2}).failure == "crash"
    assert judge_attack(_run(rc=0), argv, {2}).failure == "exit-status"
    assert judge_attack(_run(rc=2, stderr="preclint: error: b.json: not a regular file\n"), argv, {0, 1, 2}).ok


def test_the_oracle_sees_time_that_grows_faster_than_the_checks():
    assert growth_verdict({1: 1.0, 100: 1.6, 400: 10.0}, 100).failure == "slow-growth"
    assert growth_verdict({1: 1.0, 100: 1.6, 400: 3.6}, 100).ok
    assert growth_verdict({1: 1.0, 100: 1.0, 400: 1.5}, 100).ok  # too fast to tell


def test_the_oracle_tells_files_links_fifos_and_directories_apart(tmp_path):
    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "p")
    os.symlink(tmp_path / "f", tmp_path / "l")
    (tmp_path / "d").mkdir()
    kinds = {name: digest(str(tmp_path / name)) for name in ("f", "p", "l", "d", "missing")}
    assert len(set(kinds.values())) == 5 and kinds["missing"] == "missing"
    (tmp_path / "d" / "new.json").write_text("{}")
    assert digest(str(tmp_path / "d")) != kinds["d"]


def test_findings_are_compared_whatever_their_order():
    a = {"findings": [{"code": "PCL101", "location": {"path": "m.py", "line": 1}}, {"code": "PCL203"}]}
    b = {"findings": list(reversed(a["findings"]))}
    assert findings_of(json.dumps(a)) == findings_of(json.dumps(b)) != findings_of(json.dumps({"findings": []}))


@pytest.mark.slow
def test_a_run_that_outgrows_its_memory_is_a_blow_up_not_a_crash(tmp_path):
    """run_limited's RLIMIT_DATA: a model that allocates 3 GB at import ends as ``memory``."""
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import torch
        hog = bytearray(3 << 30)
    """))
    argv = ["check", "m.py", "--output-format", "concise"]
    result = run_limited(argv, str(tmp_path), timeout=300, memory_mb=1536)
    assert judge_attack(result, argv, {2}).failure == "memory", (result.rc, result.stderr[-500:])


def test_every_payload_carries_its_marker():
    for index, payload in enumerate(PAYLOADS):
        assert f"INJ{index:02d}" in payload


def test_the_note_of_a_nondeterministic_model_is_not_read_from_the_environment():
    """A json report names torch's determinism flags in its environment: they say nothing of the model."""
    from benchmarks.fuzz.attack_models import _prose

    doc = {"findings": [], "notes": ["probe: emulated on x86_64"],
           "environment": {"torch.backends.cudnn.deterministic": False}}
    assert "determin" not in _prose(json.dumps(doc), "json").lower()
    doc["notes"].append("the forward differs run-to-run")
    assert "run-to-run" in _prose(json.dumps(doc), "json")
