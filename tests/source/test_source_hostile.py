"""What a hostile or merely strange repository can give ``preclint check --source-only``: none of it
may run code, hang, crash, lose data, or make a valid file go unchecked."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest


from tests.source.test_source_cli import AMP, run

ASSERT = "import torch\n\ntorch.testing.assert_allclose(torch.ones(3), torch.ones(3), rtol=1e-3, atol=1e-5)\n"


def preclint(*args, cwd, timeout=120, env=None):
    """The CLI in a child process: a crash or a hang there fails the test, not the test run."""
    return subprocess.run(
        [sys.executable, "-m", "preclint", "check", "--source-only", "--output-format", "concise", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


# ---------------------------------------------------------------------------- git

@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_hostile_git_repository_runs_nothing(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    marker = tmp_path / "pwned"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for key, value in [
        ("core.fsmonitor", str(hook)),  # run by git status / ls-files
        ("filter.evil.clean", str(hook)), ("filter.evil.smudge", str(hook)), ("filter.evil.process", str(hook)),
        ("core.hooksPath", str(tmp_path)), ("alias.ls-files", f"!{hook}"), ("core.pager", str(hook)),
        ("diff.external", str(hook)), ("core.sshCommand", str(hook)),
    ]:
        subprocess.run(["git", "config", key, value], cwd=repo, check=True)
    (repo / ".gitattributes").write_text("*.py filter=evil\n")
    (repo / "pkg" / "m.py").write_text(AMP)
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x.py").write_text(AMP)
    # a worktree-style .git file pointing into the hostile repository's git directory
    other = tmp_path / "other"
    other.mkdir()
    (other / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    (other / "n.py").write_text(AMP)
    # the hook works: git itself would run it
    subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True)
    assert marker.exists(), "the test's fsmonitor hook should fire under git"
    marker.unlink()
    env = {"GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo)}
    for cwd, target in ((repo, "."), (repo, "pkg"), (repo / "pkg", "."), (other, ".")):
        done = preclint(str(target), cwd=cwd, env=env)
        assert done.returncode == 1, done.stderr
        assert "PCL502" in done.stdout and "ignored/x.py" not in done.stdout
        assert not marker.exists(), f"git configuration of the checked repository ran ({cwd}, {target})"


# ---------------------------------------------------------------------------- files that are no files

@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_py_is_skipped_not_read(project):
    (project / "pkg" / "m.py").write_text(AMP)
    os.mkfifo(project / "pkg" / "pipe.py")
    os.mkfifo(project / "pkg" / ".gitignore")  # an ignore file that is a FIFO must not block either
    done = preclint("pkg", cwd=project, timeout=60)
    assert done.returncode == 1 and "pkg/m.py:3:6: PCL502" in done.stdout
    assert "pkg/pipe.py: not a regular file (a FIFO, socket or device); skipped" in done.stderr
    done = preclint("pkg/pipe.py", cwd=project, timeout=60)  # named explicitly: skipped as well, and as it
    assert done.returncode == 2 and "not a regular file" in done.stderr  # was all there was, nothing was checked


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_dangling_and_duplicate_symlinks(project, capsys):
    (project / "pkg" / "m.py").write_text(AMP)
    os.symlink("missing.py", project / "pkg" / "dangling.py")
    os.symlink("m.py", project / "pkg" / "alias.py")  # the same file twice
    os.symlink(project / "pkg", project / "pkg" / "loop")  # a directory symlink (not followed)
    code, out, err = run(capsys, "pkg")
    assert code == 1
    assert out.splitlines()[0].startswith("pkg/m.py:3:6: PCL502")
    assert "Found 1 finding." in out  # checked once, under the file's own path
    assert "pkg/dangling.py: a dangling symlink; skipped" in err


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_fix_does_not_write_through_a_symlink_that_leaves_the_checked_paths(project, capsys):
    outside = project / "outside.py"
    outside.write_text(ASSERT)
    os.symlink(outside, project / "pkg" / "link.py")
    code, _, err = run(capsys, "--fix", "pkg")
    assert outside.read_text() == ASSERT
    assert "pkg/link.py: not fixed: a symlink to a file outside the checked paths" in err


# ---------------------------------------------------------------------------- deep and long code

DEEP_FILES = {
    # (text, what preclint must say): each ran libcst's native parser out of stack (SIGSEGV)
    "brackets": (AMP + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n", "too many nested parentheses"),
    "unary": (AMP + "x = " + "-" * 20000 + "a\n", "Python cannot compile it either"),
    "sum": ("import torch\nx = " + " + ".join(["a"] * 8000) + "\n" + AMP, None),
    "attributes": ("import torch\nx = a" + ".b" * 4000 + "\n" + AMP, None),
    "strings": ("import torch\nx = (" + " ".join(['"a"'] * 5000) + ")\n" + AMP, None),
    "medium": ("import torch\nx = " + " + ".join(["a"] * 500) + "\n" + AMP, None),
}


@pytest.mark.slow
@pytest.mark.subprocess
def test_deep_and_long_expressions_neither_crash_nor_stall(project):
    for name, (text, _) in DEEP_FILES.items():
        (project / "pkg" / f"{name}.py").write_text(text)
    done = preclint("--no-cache", "--output-format", "json", "pkg", cwd=project, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    found = {(f["location"]["path"], f["code"]): f["message"] for f in json.loads(done.stdout)["findings"]}
    for name, (text, message) in DEEP_FILES.items():
        path = f"pkg/{name}.py"
        if message is not None:
            assert message in found[(path, "PCL599")]
        elif sys.version_info >= (3, 13) or name != "sum":  # CPython < 3.13 cannot compile 8,000 terms
            assert (path, "PCL599") not in found and (path, "PCL502") in found, name


@pytest.mark.slow
def test_a_deep_expression_a_rule_needs_is_checked_not_elided():
    from preclint.source.run import check_text

    text = "import torch\nx = " + " + ".join(["a"] * 1100) + " + torch.cuda.amp.autocast()\n"
    (finding,) = check_text(text, "pkg/m.py")
    assert finding.code == "PCL502" and (finding.location.line, finding.location.column) == (2, 4405)


def test_check_file_is_the_in_process_entry_point(project):
    from preclint.source.run import check_file

    (project / "pkg" / "m.py").write_text(DEEP_FILES["medium"][0])
    (finding,) = check_file(str(project / "pkg" / "m.py"))
    assert finding.code == "PCL502" and finding.location.path == "pkg/m.py" and finding.location.line == 5


@pytest.mark.slow
@pytest.mark.subprocess
def test_null_bytes_are_a_file_preclint_cannot_check_not_an_internal_error(project):
    # Python 3.12's tokenize raised SystemError on a NUL byte; CPython refuses the file either way
    from preclint.source.run import check_file

    (project / "pkg" / "nul.py").write_bytes(b"import torch\n\nx = torch.cuda.amp.autocast()\x00  # noqa: E501\ny = (1,\n")
    (finding,) = check_file(str(project / "pkg" / "nul.py"))
    assert finding.code == "PCL599" and "null bytes" in finding.message and finding.location.line == 3
    done = preclint("--no-cache", "--output-format", "json", "pkg/nul.py", cwd=project)
    assert done.returncode == 1 and "internal error" not in done.stderr, done.stderr[-2000:]
    (reported,) = json.loads(done.stdout)["findings"]
    assert reported["code"] == "PCL599" and "null bytes" in reported["message"]


@pytest.mark.slow
def test_the_guard_measures_a_broken_flat_file_without_tokenize(monkeypatch):
    # 400,000 tokens on one line that CPython cannot parse: Python 3.12's tokenize took minutes on it.
    # The guard's own scan stops as soon as a statement is past the budget.
    import tokenize

    from preclint.text import guard, lexical

    def refuse(*args, **kwargs):
        raise AssertionError("the guard asked tokenize")

    monkeypatch.setattr(tokenize, "generate_tokens", refuse)
    monkeypatch.setattr(tokenize, "tokenize", refuse)
    counted = []
    scan = lexical.tokens
    monkeypatch.setattr(lexical, "tokens", lambda text: (counted.append(token) or token for token in scan(text)))
    text = "x = [" + ", ".join(["1"] * 200_000) + " 2 3]\n"  # a SyntaxError near the end
    verdict = guard.run_with_deep_stack(lambda: guard.judge(text))
    assert verdict.error is not None and verdict.final
    assert len(counted) == guard.DEPTH_BUDGET + 1  # the scan stopped at the first token past the budget
    assert lexical.most_tokens_in_a_statement(text) == 3 + 200_000 + 199_999 + 3  # x = [ ... 2 3 ]


def test_a_measurement_that_fails_is_a_file_preclint_cannot_check(monkeypatch):
    from preclint.text import guard
    from preclint.source.run import check_text

    def broken(*args, **kwargs):
        raise SystemError("returned a result with an exception set")

    monkeypatch.setattr(guard, "_long_expressions", broken)
    (finding,) = check_text("import torch\nwith torch.cuda.amp.autocast():\n    pass\n", "pkg/m.py")
    assert finding.code == "PCL599" and "SystemError" in finding.message


def test_comments_are_found_in_strings_free_text_and_broken_files():
    from preclint.text import lexical

    text = 'a = f"#no" \'#no\'  # one\r\nb = """\n# no\n"""  # two\rc = (1,  # three\n  2 \'unterminated # four\n'
    assert [(c.line, c.column, c.text) for c in lexical.comments(text)] == [
        (1, 18, "# one"), (4, 5, "# two"), (5, 9, "# three")]  # "# four" is in the unterminated literal
    assert lexical.most_tokens_in_a_statement(text) == 7  # c = ( 1 , 2 'unterminated # four
    assert lexical.string_literals('("a" \'b\'  # c\n rb"""d""")') == 3


@pytest.mark.slow
def test_one_fix_run_fixes_nested_calls_and_counts_what_it_applied(project, capsys):
    # the fixes inside a replaced call are carried into its replacement: no level is left for a second run
    (project / "pkg" / "m.py").write_text(
        "import torch\n\nx = " + "torch.cuda.amp.autocast(" * 190 + ")" * 190 + "\n")
    code, out, err = run(capsys, "--no-cache", "--fix", "pkg")
    text = (project / "pkg" / "m.py").read_text()
    assert code == 0 and "torch.cuda.amp" not in text and text.count('torch.autocast("cuda"') == 190
    assert "Fixed 190 findings." in err and "warning" not in err, err
    assert run(capsys, "--no-cache", "--fix", "pkg")[0] == 0 and (project / "pkg" / "m.py").read_text() == text


def test_fix_warns_once_when_its_round_limit_leaves_fixes(project, capsys, monkeypatch):
    from preclint.source import fix

    apply_all = fix.apply_fixes
    monkeypatch.setattr(fix, "apply_fixes", lambda source, fixes: apply_all(source, fixes[:1]))  # one a round
    monkeypatch.setattr(fix, "MAX_ROUNDS", 2)
    (project / "pkg" / "m.py").write_text("import torch\n\n" + "x = torch.cuda.amp.autocast()\n" * 3)
    code, out, err = run(capsys, "--no-cache", "--fix", "pkg")
    assert code == 1 and "Fixed 2 findings." in err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "pkg/m.py: fixes still left after 2 rounds" in warning
    assert (project / "pkg" / "m.py").read_text().count("torch.cuda.amp") == 1


# ---------------------------------------------------------------------------- fixes keep the file's identity

@pytest.mark.skipif(os.name != "posix", reason="POSIX owners and links")
def test_fix_keeps_owner_mode_and_hard_links(project, capsys):
    path = project / "pkg" / "m.py"
    path.write_text(ASSERT)
    os.link(path, project / "hardlink.py")
    path.chmod(0o640)
    owner = (path.stat().st_uid, path.stat().st_gid)
    if os.geteuid() == 0:
        os.chown(path, 12345, 12345)
        owner = (12345, 12345)
    inode = path.stat().st_ino
    code, _, err = run(capsys, "--fix", "pkg")
    assert "Fixed 1 finding." in err
    info = path.stat()
    assert (info.st_ino, info.st_nlink, stat.S_IMODE(info.st_mode)) == (inode, 2, 0o640)
    assert (info.st_uid, info.st_gid) == owner
    assert "assert_close" in (project / "hardlink.py").read_text()  # the link sees the fix


def test_fix_leaves_a_file_that_changed_since_it_was_read(project, capsys, monkeypatch):
    path = project / "pkg" / "m.py"
    path.write_text(ASSERT)
    import preclint.source.fix as fix

    real_fix_run = fix.fix_run

    def edited_meanwhile(*args, **kwargs):
        result = real_fix_run(*args, **kwargs)
        path.write_text(ASSERT + "# the user's edit\n")
        return result

    monkeypatch.setattr(fix, "fix_run", edited_meanwhile)
    code, _, err = run(capsys, "--fix", "pkg")
    assert path.read_text() == ASSERT + "# the user's edit\n"
    assert "pkg/m.py: not fixed: it changed on disk while preclint ran" in err


# ---------------------------------------------------------------------------- the cache

def test_cache_hit_miss_and_invalidation(project, capsys, monkeypatch):
    from preclint.config import Config
    from preclint.source.run import check_paths

    (project / "pkg" / "a.py").write_text(AMP)
    (project / "pkg" / "b.py").write_text(ASSERT)
    first = check_paths(["pkg"], Config())
    assert (first.parsed, first.cached) == (2, 0)
    again = check_paths(["pkg"], Config())
    assert (again.parsed, again.cached) == (0, 2)
    assert sorted((f.location, f.code) for f in again.findings) == sorted((f.location, f.code) for f in first.findings)
    (project / "pkg" / "a.py").write_text("\n" + AMP)  # content changed: that file only
    changed = check_paths(["pkg"], Config())
    assert (changed.parsed, changed.cached) == (1, 1)
    assert [f.location.line for f in changed.findings if f.code == "PCL502"] == [4]
    other_rules = check_paths(["pkg"], Config(select=["PCL502"]))  # other settings: another cache
    assert (other_rules.parsed, other_rules.cached) == (1, 0)
    assert check_paths(["pkg"], Config(), cache=False).parsed == 2
    # a corrupted cache counts as empty
    for directory, _, files in os.walk(project / "cache"):
        for name in files:
            with open(os.path.join(directory, name), "w") as handle:
                handle.write('{"format": 1, "files": {"x": [1, 2')
    assert check_paths(["pkg"], Config()).parsed == 2
    # the cache never lands in the checked project, and --no-cache writes none
    assert sorted(os.listdir(project)) == ["cache", "pkg"]
    shutil.rmtree(project / "cache")
    assert run(capsys, "--no-cache", "pkg")[0] == 1 and not (project / "cache").exists()


def test_cache_in_a_checked_repository_is_not_trusted(project, capsys):
    """A repository cannot ship results: the cache lives outside it, keyed by what preclint reads."""
    (project / "pkg" / "a.py").write_text(AMP)
    (project / ".preclint_cache").mkdir()
    (project / ".preclint_cache" / "forged.json").write_text('{"format": 1, "files": {}}')
    code, out, _ = run(capsys, "pkg")
    assert code == 1 and "PCL502" in out
