"""The front door and the documentation site: the README is short and its links and commands hold,
nothing tells a reader to install preclint by name from a package index (there is no release), and
the site in docs/ builds with `mkdocs build --strict`, where a broken link or anchor fails the build."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

README = ROOT / "README.md"
README_LIMIT = 20_000  # bytes: what it is, install, two commands, an example, the options at a glance, links
# the two commands a fresh machine runs from the README: the example model, and the tests
TRY_IT = "pip install -e . && preclint check examples/mixed_precision_pitfalls.py"
TESTS = "pip install -e '.[test]' && python -m pytest"
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# pip told to fetch preclint by name (a path, a wheel file or "preclint @ URL" is not a name)
BY_NAME = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?preclint(?:\[[^\]]*\])?['\"]?(?!\s*@)(?:\s|$)")


def docs_pages():
    return sorted((ROOT / "docs").rglob("*.md"))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path: Path) -> set:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {github_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}


def test_the_readme_is_a_front_door_not_a_manual():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) < README_LIMIT
    blocks = FENCE.findall(text)
    assert any(TRY_IT in block for block in blocks) and any(TESTS in block for block in blocks)
    for section in ("## Install", "## Commands at a glance", "## Options at a glance", "## Exit codes"):
        assert section in text


def test_the_readme_links_reach_files_and_headings():
    broken = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.exists():
            broken.append(target)
        elif anchor and anchor not in headings(file):
            broken.append(target)
    assert not broken


def test_nothing_says_to_install_preclint_by_name():
    """No command in the README, the docs or CONTRIBUTING.md, and no message of preclint's, tells a
    reader to install preclint from a package index by name: there is no release there."""
    found = []
    for path in [README, ROOT / "CONTRIBUTING.md", *docs_pages()]:
        for block in FENCE.findall(path.read_text(encoding="utf-8")):
            found += [f"{path.relative_to(ROOT)}: {line}" for line in block.splitlines() if BY_NAME.search(line)]
    for path in (ROOT / "preclint").rglob("*.py"):
        found += [f"{path.relative_to(ROOT)}: {line.strip()}" for line in path.read_text(encoding="utf-8").splitlines()
                  if BY_NAME.search(line)]
    assert not found
    assert BY_NAME.search("pip install preclint") and BY_NAME.search("pip install -U 'preclint[models]'")
    assert not BY_NAME.search('pip install "preclint @ https://example.org/preclint.zip"')
    assert not BY_NAME.search("pip install dist/preclint-0.1.0-py3-none-any.whl")


needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None and not os.environ.get("PRECLINT_REQUIRE_DOCS"),
                                  reason="mkdocs builds the site (it is in the test extras: pip install -e '.[test]')")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.subprocess
@needs_mkdocs
def test_the_site_builds_strictly_with_every_page(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").with_suffix("") for p in (tmp_path / "site").rglob("*.html")}
    for page in docs_pages():
        name = page.relative_to(ROOT / "docs").with_suffix("")
        expected = name.parent / "index" if name.name in ("README", "index") else name / "index"
        assert expected in built, name


@pytest.mark.slow
@pytest.mark.subprocess
@needs_mkdocs
@pytest.mark.parametrize("breakage, message", [
    (("usage.md", "](#exit-codes)", "](#exit-code)"), "no such anchor"),
    (("index.md", "](install.md)", "](installing.md)"), "not found among documentation files"),
    (("plan.md", "# A mixed-precision plan", "# A mixed-precision plan\n\n[wrong](rules/README.md#no-such-section)"),
     "does not contain an anchor"),
])
def test_a_broken_link_or_anchor_fails_the_build(tmp_path, breakage, message):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page, old, new = breakage
    text = (tmp_path / "docs" / page).read_text(encoding="utf-8")
    assert old in text
    (tmp_path / "docs" / page).write_text(text.replace(old, new, 1), encoding="utf-8")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and message in done.stderr, done.stderr[-3000:]
