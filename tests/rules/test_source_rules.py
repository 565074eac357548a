"""Every source rule against its own examples (Fixit style): each invalid snippet must produce the
rule's finding, each valid one must not; fixable rules must fix their invalid snippets into code that
parses and no longer has the finding."""
from __future__ import annotations

import libcst as cst
import pytest

from preclint.config import Config
from preclint.rules import source_rules
from preclint.source.fix import fix_file
from preclint.source.run import check_source, check_text, selected_rules
from preclint.text.sourcefile import SourceFile
from tests.snapshots import assert_matches_snapshot, read_snapshot

RULES = source_rules()
# snippets are checked as a library module (not a test, not a script), the strictest setting
PATH = "pkg/module.py"


def _cases(kind):
    return [
        pytest.param(rule, snippet, id=f"{rule.code}-{kind}-{i}")
        for rule in RULES
        for i, snippet in enumerate(getattr(rule, kind))
    ]


def codes(snippet: str):
    return [f.code for f in check_text(snippet, PATH)]


def test_every_source_rule_has_examples_and_docs():
    assert {r.code for r in RULES} >= {"PCL500", "PCL501", "PCL502", "PCL503", "PCL504", "PCL505", "PCL599"}
    for rule in RULES:
        assert rule.valid and rule.invalid, rule.code
        assert rule.why.strip() and rule.example.strip() and rule.fix.strip() and rule.summary.strip(), rule.code
        assert rule.code.startswith("PCL5") and len(rule.code) == 6
        assert rule.name == rule.name.lower() and " " not in rule.name


@pytest.mark.parametrize("rule, snippet", _cases("invalid"))
def test_invalid_snippet_is_reported(rule, snippet, update_snapshots, request):
    findings = check_text(snippet, PATH)
    assert rule.code in [f.code for f in findings]
    index = request.node.callspec.id.rpartition("-")[2]
    assert_matches_snapshot(rule.code, f"invalid-{index}", findings, update_snapshots)


def test_every_snapshot_entry_is_an_example():
    for rule in RULES:
        assert set(read_snapshot(rule.code)) == {f"invalid-{i}" for i in range(len(rule.invalid))}, rule.code


@pytest.mark.parametrize("rule, snippet", _cases("valid"))
def test_valid_snippet_is_clean(rule, snippet):
    assert rule.code not in codes(snippet)


FIXABLE = [r for r in RULES if r.fixable]


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule, snippet",
    [pytest.param(r, s, id=f"{r.code}-fix-{i}") for r in FIXABLE for i, s in enumerate(r.invalid)],
)
def test_fix_removes_the_finding_and_keeps_valid_python(rule, snippet):
    rules = [r() for r in selected_rules(Config())]
    source = SourceFile(PATH, snippet)
    before = [f for f in check_text(snippet, PATH) if f.code == rule.code]
    fixed = fix_file(source, rules, Config())
    if not any(f.fixable for f in before):
        assert fixed is None
        return
    assert fixed is not None
    text, count, unfinished = fixed
    assert not unfinished
    cst.parse_module(text)
    compile(text, PATH, "exec")
    after = [f for f in check_text(text, PATH) if f.code == rule.code]
    assert not any(f.fixable for f in after)
    assert len(after) == len(before) - count
    # a second --fix has nothing left to do
    assert fix_file(SourceFile(PATH, text), rules, Config()) is None


def test_pcl502_fix_output():
    text = (
        "import torch\n"
        "\n"
        "with torch.cuda.amp.autocast(True, torch.bfloat16):  # keep me\n"
        "    y = model(x)\n"
        "scaler = torch.cuda.amp.GradScaler(2.0**10)\n"
    )
    fixed, count, _ = fix_file(SourceFile(PATH, text), [r() for r in selected_rules(Config())], Config())
    assert count == 2
    assert fixed == (
        "import torch\n"
        "\n"
        'with torch.autocast("cuda", enabled=True, dtype=torch.bfloat16):  # keep me\n'
        "    y = model(x)\n"
        'scaler = torch.amp.GradScaler("cuda", 2.0**10)\n'
    )


@pytest.mark.slow
def test_pcl502_fix_of_from_import_adds_torch_and_drops_the_unused_import():
    text = "from torch.cuda.amp import autocast\n\nwith autocast():\n    pass\n"
    fixed, _, _ = fix_file(SourceFile(PATH, text), [r() for r in selected_rules(Config())], Config())
    assert fixed == 'import torch\n\nwith torch.autocast("cuda", dtype=torch.float16):\n    pass\n'


def _fixed(text, unsafe=False):
    return fix_file(SourceFile(PATH, text), [r() for r in selected_rules(Config())], Config(), unsafe=unsafe)


def test_pcl503_fix_is_safe_only_where_the_source_shows_tensors_and_numeric_tolerances():
    safe = "import torch\ntorch.testing.assert_allclose(torch.ones(3), torch.zeros(3).float(), 1e-3, 1e-5)\n"
    fixed, _, _ = _fixed(safe)
    assert fixed == (
        "import torch\n"
        "torch.testing.assert_close(torch.ones(3), torch.zeros(3).float(), rtol=1e-3, atol=1e-5, "
        "equal_nan=True, check_dtype=False)\n"
    )


@pytest.mark.parametrize(
    "call, why",
    [
        # tolerances that may be None: assert_allclose then chose its own, assert_close stricter ones
        ("torch.testing.assert_allclose(a, b, rtol=rtol, atol=atol)", "must not be None"),
        # a tensor against a Python number: assert_allclose made it a tensor, assert_close raises
        ("torch.testing.assert_allclose(torch.ones(3), 1.0, rtol=1e-3, atol=1e-5)", "must be tensors"),
        ("torch.testing.assert_allclose(out, ref, 1e-3, 1e-5)", "must be tensors"),
    ],
)
def test_pcl503_behaviour_changing_rewrites_are_unsafe_fixes(call, why):
    text = f"import torch\n{call}\n"
    (finding,) = [f for f in check_text(text, PATH) if f.code == "PCL503"]
    assert not finding.fixable and "--unsafe-fixes" in finding.fix and why in finding.fix
    assert _fixed(text) is None
    fixed, count, _ = _fixed(text, unsafe=True)
    assert count == 1 and "torch.testing.assert_close(" in fixed and "check_dtype=False" in fixed


def test_pcl503_unsafe_fix_keeps_a_non_literal_message_as_assert_allclose_passed_it():
    fixed, _, _ = _fixed("import torch\ntorch.testing.assert_allclose(a, b, 0, 0, msg=m)\n", unsafe=True)
    assert "msg=m or None" in fixed


def test_fixes_keep_every_comment_of_a_multiline_call():
    text = (
        "import torch\n"
        "\n"
        "def test_x():\n"
        "    torch.testing.assert_allclose(  # compare\n"
        "        torch.ones(2),  # actual\n"
        "        torch.ones(2),\n"
        "        rtol=1e-3,\n"
        "        atol=1e-5,  # absolute\n"
        "    )\n"
        "    with torch.cuda.amp.autocast(\n"
        "        enabled=True,  # on\n"
        "    ):\n"
        "        pass\n"
    )
    fixed, count, _ = _fixed(text)
    assert count == 2
    assert fixed == (
        "import torch\n"
        "\n"
        "def test_x():\n"
        "    torch.testing.assert_close(  # compare\n"
        "        torch.ones(2),  # actual\n"
        "        torch.ones(2),\n"
        "        rtol=1e-3,\n"
        "        atol=1e-5,  # absolute\n"
        "        equal_nan=True,\n"
        "        check_dtype=False,\n"
        "    )\n"
        "    with torch.autocast(\n"
        '        "cuda",\n'
        "        enabled=True,  # on\n"
        "        dtype=torch.float16,\n"
        "    ):\n"
        "        pass\n"
    )


def test_a_local_name_shadowing_torch_is_not_the_torch_module():
    text = (
        "import torch\n"
        "\n"
        "def check(torch, a, b):\n"
        "    torch.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)\n"
        "    with torch.cuda.amp.autocast():\n"
        "        pass\n"
        "\n"
        "def other():\n"
        "    torch = FakeTorch()\n"
        "    torch.cuda.amp.GradScaler()\n"
    )
    assert [f.code for f in check_text(text, PATH)] == []
    # and a fix never writes ``torch.`` where ``torch`` is a local name
    from_import = (
        "from torch.cuda.amp import autocast\n"
        "\n"
        "def run(torch):\n"
        "    with autocast():\n"
        "        pass\n"
    )
    (finding,) = check_text(from_import, PATH)
    assert finding.code == "PCL502" and not finding.fixable and "names something else" in finding.fix


def test_pcl503_without_tolerances_is_reported_without_a_fix():
    text = "import torch\ntorch.testing.assert_allclose(a, b)\n"
    (finding,) = [f for f in check_text(text, PATH) if f.code == "PCL503"]
    assert not finding.fixable
    assert "rtol=1e-4, atol=1e-5" in finding.fix


def test_pcl501_message_gives_an_honest_tolerance():
    text = (
        "import torch\n"
        "def test_x():\n"
        "    y = model.half()(x.half())\n"
        "    torch.testing.assert_close(y.float(), ref, rtol=1e-5, atol=1e-5)\n"
    )
    (finding,) = [f for f in check_text(text, PATH) if f.code == "PCL501"]
    assert finding.location.line == 4
    assert "rtol=1e-05" in finding.message and "fp16" in finding.message
    assert "rtol=2.0e-03" in finding.fix and "line 3" in finding.fix
    assert finding.precisions == ("fp16",)


def test_pcl501_judges_against_bf16_resolution():
    text = (
        "import torch\n"
        "def test_x():\n"
        "    with torch.autocast('cpu'):\n"
        "        y = model(x)\n"
        "    assert torch.allclose(y, ref, rtol=5e-3, atol=1e-2)\n"
    )
    # cpu autocast runs in bf16 (u = 3.9e-3): rtol=5e-3 is under 2u
    assert "PCL501" in codes(text)
    assert "PCL501" not in codes(text.replace("'cpu'", "'cuda'"))  # fp16: 5e-3 is above 4u


def test_pcl504_test_files_and_scripts_may_switch_tf32_at_import():
    text = "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
    assert "PCL504" in [f.code for f in check_text(text, "pkg/layers.py")]
    assert "PCL504" not in [f.code for f in check_text(text, "tests/test_layers.py")]
    assert "PCL504" not in [f.code for f in check_text(text, "conftest.py")]
    assert "PCL504" not in [f.code for f in check_text("#!/usr/bin/env python\n" + text, "train.py")]


def test_pcl505_needs_fp16_in_the_file():
    text = "import torch\ny = x / (x.norm() + 1e-8)\n"
    assert "PCL505" not in codes(text)
    assert "PCL505" in codes("import torch\nx = x.half()\n" + text[13:])


def test_pcl599_reports_the_syntax_error_position():
    (finding,) = check_text("import torch\nok = torch.allclose(a.half(),\n", PATH)
    assert finding.code == "PCL599" and finding.severity == "error"
    assert finding.location.path == PATH and finding.location.line >= 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_rule_modules_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys\nfrom preclint.rules import all_rules\nall_rules()\nassert 'torch' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_rules_claims_hold_in_torch():
    """What PCL504 and PCL505 tell users, measured on the installed torch (CPU)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    # PCL505: eps=1e-8 is lost with fp16 parameters (Adam) and fp16 values (guards, normalize) ...
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = torch.optim.Adam([p], lr=1e-3, eps=1e-8)
    p.grad = torch.tensor([0.0, 1e-3], dtype=torch.float16)
    opt.step()
    assert not torch.isfinite(p.data).any()
    zero = torch.zeros(1, 4, dtype=torch.float16)
    assert torch.isnan(F.normalize(zero, dim=-1, eps=1e-12)).all()
    assert torch.isnan(zero / (zero.norm(dim=-1, keepdim=True) + 1e-8)).all()
    # ... while LayerNorm's kernel adds eps in fp32 (why PCL505 reports it as info only)
    assert torch.isfinite(torch.nn.LayerNorm(4, eps=1e-12).half()(zero)).all()
    # PCL504: cudnn.flags() turns allow_tf32 back on unless it is passed
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        with torch.backends.cudnn.flags(enabled=False):
            assert torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cudnn.allow_tf32 = before


@pytest.mark.slow
@pytest.mark.subprocess
def test_mixing_the_tf32_apis_raises_in_torch():
    """PCL504's first claim, in a fresh interpreter (it changes process-wide state)."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "try:\n"
        "    torch.backends.cuda.matmul.allow_tf32\n"
        "except RuntimeError as e:\n"
        "    assert 'mix of the legacy and new APIs' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rule, snippet", _cases("invalid") + _cases("valid"))
def test_a_focused_parse_finds_what_a_full_parse_finds(rule, snippet):
    """check_paths blanks top-level functions and classes that hold no trigger word: same findings."""
    rules = [r() for r in selected_rules(Config())]
    text = snippet + "\n\nclass Unrelated:\n    def method(self):\n        return [i * 2 for i in range(3)]\n"

    def found(focus):
        return [(f.code, f.location.line, f.location.column, f.message)
                for f in check_source(SourceFile(PATH, text), rules, focus=focus)]

    assert found(True) == found(False)


def test_a_focused_parse_follows_module_level_names():
    text = (
        "import torch\n"
        "EPS = 1e-8\n"
        "model = Net().half()\n"
        "\n"
        "def guard(x, n):\n"
        "    return x / (n + EPS)\n"
    )
    rules = [r() for r in selected_rules(Config())]
    (finding,) = check_source(SourceFile(PATH, text), rules, focus=True)
    assert finding.code == "PCL505" and finding.location.line == 6
