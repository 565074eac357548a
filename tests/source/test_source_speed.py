"""What makes source-only runs fast must not change what they report: positions computed for the
statement around a finding, the prefilter's cheapest-first screen, suppression directives stored in
the cache."""
from __future__ import annotations

import json
import os

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from preclint.config import Config
from preclint.text.index import descendants
from preclint.text.positions import Positions
from preclint.source.run import _active, check_paths, selected_rules, wanted
from preclint.text.sourcefile import SourceFile
from preclint.source.suppress import apply_suppressions, file_directives, may_name_preclint, parse_directives
from tests import paths

ROOT = str(paths.ROOT)

# layouts where a statement's own code could be placed wrongly: nested bodies, decorators, comments
# before a statement, identical statements, tabs, \r\n and \r line ends, a form feed, no newline at
# the end, characters outside ASCII before a node on its line
TRICKY = [
    "import torch\n\n\nclass A:\n    # about f\n    @staticmethod\n    def f(x):\n        if x:\n"
    "            return torch.allclose(x, x, rtol=1e-5)\n        return x.half()\n\n"
    "    class B:\n        def g(self):\n            return torch.ones(2)\n",
    "def f():\n    with torch.backends.cudnn.flags(enabled=True):\n        y = 1\n\n"
    "def g():\n    with torch.backends.cudnn.flags(enabled=True):\n        y = 1\n",
    "x = 1\nx = 1\ny = torch.zeros(3)\nx = 1\n",
    "class A:\r\n\tdef f(self):\r\n\t\treturn self.x.half() / (self.n + 1e-8)\r\n",
    "class A:\r\tdef f(self):\r\t\treturn 1e-8\r",
    "def f():\n    a = 1\x0c\n    return torch.tensor(a)  # é\n",
    "s = 'éé'; t = torch.float16\ndef f():\n    return {'ü': torch.ones(1).half()}",
    "if True:\n    def f():\n        return torch.ones(1)\nelse:\n    f = None\n",
    "@decorator(\n    torch.half,\n)\nclass C(\n    Base,\n):\n    x = (\n  1e-8\n)\n",
]


def _every_position_agrees(text: str) -> int:
    module = cst.parse_module(text)
    whole = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    local = Positions(module, text)
    nodes = [node for node in descendants(module) if node is not module]
    for node in nodes:
        assert local[node] == whole[node], (text, node)
    return len(nodes)


@pytest.mark.parametrize("text", TRICKY)
def test_statement_positions_are_the_module_positions(text):
    assert _every_position_agrees(text) > 5


def test_statement_positions_do_not_fall_back_to_the_whole_module():
    text = TRICKY[0] + TRICKY[3].replace("\r\n", "\n").replace("class A", "class Z")
    module = cst.parse_module(text)
    local = Positions(module, text)
    for node in descendants(module):
        if isinstance(node, cst.Call):
            local[node]
    assert local._whole is None  # every call was placed by its own statement


@pytest.mark.slow
def test_statement_positions_on_preclint_own_rules():
    # real modules: classes with docstrings, nested functions, decorators, long expressions
    for name in ("tolerance_below_resolution.py", "tf32_flags.py", "fp16_epsilon_literal.py"):
        with open(os.path.join(ROOT, "preclint", "rules", "source", name), encoding="utf-8") as handle:
            assert _every_position_agrees(handle.read()) > 500


def test_findings_in_repeated_blocks_point_at_their_own_lines():
    # two identical with-blocks: each finding is placed by its function, not by the first match
    from preclint.source.run import check_text

    text = "import torch\n\n" + "".join(
        f"def test_{i}():\n    with torch.backends.cudnn.flags(enabled=True):\n        y = 1\n\n" for i in range(3)
    )
    lines = sorted(f.location.line for f in check_text(text, "pkg/m.py") if f.code == "PCL504")
    assert lines == [4, 8, 12]


def test_screen_order_changes_no_answer():
    # the groups of a rule are a conjunction: looked at cheapest first, the answer is the same
    rules = [rule() for rule in selected_rules(Config())]
    texts = [
        "x = 1e-8\n", "import torch\nx = y.half() / (n + 1e-8)\n", "import torch\nwith cudnn.flags(): pass\n",
        "import torch\ncudnn = 1\nflags = 2\n", "cudnnflags = torch", "torch.testing.assert_allclose(a, b)\n",
        "import numpy as np\nnp.testing.assert_allclose(a.astype(np.float16), b, rtol=1e-7)\n",
    ]
    for text in texts:
        for rule in rules:
            in_order = all(
                any(pattern.search(text) for pattern in _patterns_of(group)) for group in getattr(rule, "triggers", ())
            )
            assert wanted(rule, text) == in_order, (rule.code, text)
            assert wanted(rule, text, {}) == in_order


def _patterns_of(group):
    from preclint.source.run import _patterns

    return _patterns(tuple(group))


def test_may_name_preclint_gate_agrees_with_the_full_scan():
    from preclint.source.suppress import _MAY_NAME_PRECLINT

    for text in ("x = 1\n", "x = 1  # NOQA\n", "x = 1  # noqa: E501\n", "x  # NoQa: pcl501\n", "# PRECLINT: ignore\n",
                 "# preclint ignore\n", "# noqa\n# pcl\n"):
        assert may_name_preclint(text) == bool(_MAY_NAME_PRECLINT.search(text)), text


def test_stored_directives_suppress_as_reading_the_file_does():
    text = (
        "import torch\n"
        "scaler = torch.cuda.amp.GradScaler()  # noqa\n"
        "other = torch.cuda.amp.GradScaler()  # preclint: ignore[PCL501]\n"
        "x = 1  # noqa: E501\n"
        "y = 2  # noqa: PCL777\n"
    )
    from preclint.source.run import check_source

    path = "pkg/m.py"
    rules = [rule() for rule in selected_rules(Config())]
    raw = check_source(SourceFile(path, text), rules)
    codes = [rule.code for rule in rules]
    read = apply_suppressions(raw, True, codes, files=[path], texts={path: text})
    known = apply_suppressions(raw, True, codes, files=[path], known={path: file_directives(text, bool(raw))})
    assert [f.sort_key() for f in read] == [f.sort_key() for f in known]
    assert sorted(f.code for f in known) == ["PCL500", "PCL500", "PCL502"]
    # a file without findings keeps only what can be reported unused
    assert file_directives("x = 1  # noqa\n", False) == {}
    assert file_directives("x = 1  # noqa\n", True) == parse_directives("x = 1  # noqa\n")


def _project(tmp_path):
    files = {
        "a.py": "import torch\nscaler = torch.cuda.amp.GradScaler()  # noqa: PCL502\n",
        "b.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\nx = 1  # preclint: ignore[PCL503]\n",
        "c.py": "x = 1  # noqa\n",
        "d.py": "y = 2  # noqa: PCL501\n",
        "e.py": b"\xff\xfe not text",
        "tests/test_e.py": "import torch\n\ndef test_f():\n    torch.testing.assert_close(a.half(), b, rtol=1e-7)\n",
    }
    files.update({f"pkg/m{i}.py": f"def f{i}(x):\n    return x + {i}  # noqa: E501\n" for i in range(12)})
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(tmp_path)


def test_cold_warm_parallel_and_single_runs_agree(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(root)
    config = Config()
    single = check_paths(["."], config, cache=False, jobs=1)
    cold = check_paths(["."], config, jobs=2)
    expected = sorted(f.sort_key() for f in single.findings)
    assert sorted(f.sort_key() for f in cold.findings) == expected
    assert {f.code for f in single.findings} >= {"PCL500", "PCL502", "PCL599"}
    assert cold.parsed == single.parsed < len(single.files)

    # warm: nothing parsed, and no file read again for its suppressions
    import preclint.source.suppress as suppress

    monkeypatch.setattr(suppress, "_read", lambda path, texts: pytest.fail(f"read {path} for its comments"))
    warm = check_paths(["."], config, jobs=2)
    assert warm.cached == len(warm.files) and warm.parsed == 0
    assert sorted(f.sort_key() for f in warm.findings) == expected


def test_screened_out_files_are_not_parsed(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    run = check_paths(["."], Config(), cache=False, jobs=1)
    rules = [rule() for rule in selected_rules(Config())]
    wanted_files = [p for p, source in run.sources.items() if source.decode_failure is not None or _active(rules, source)]
    assert run.parsed == len(wanted_files)


def test_cli_json_is_the_same_warm_and_cold(tmp_path, monkeypatch, capsys):
    from preclint.cli import main

    root = _project(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(root)
    outputs = []
    for _ in range(2):
        code = main(["check", "--source-only", "--isolated", "--output-format", "json", "."])
        outputs.append((code, json.loads(capsys.readouterr().out)["findings"]))
    assert outputs[0] == outputs[1] and outputs[0][1]
