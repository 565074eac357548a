"""``--fix`` and ``--diff``: apply the safe autofixes of the reported findings.

A fix replaces one node of the libcst tree, so everything else in the file keeps its bytes (comments,
quotes, blank lines, line endings, encoding). The fixes nested inside a replaced node are carried into
its replacement, so one round applies them all; further rounds (at most ``MAX_ROUNDS``) apply what a
round's result offers anew. Only safe fixes exist: a rule offers a replacement only
where it can show the behaviour is the same (see each rule's Fix section).

Each file is either fixed or left untouched (preclint.text.safe_io.replace_checked: a new file
renamed over it, or written in place where its owner, hard links or ACLs must stay); a file that
changed on disk since it was read is left alone, and so is a file reached through a symlink that
leads outside the paths the run was given. A file that cannot be written (its mode, an immutable
flag, a full disk) does not stop the others: ``write_fixes`` says, one line a file, which were
fixed and which were not, and why.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from preclint.config import Config
from preclint.core.findings import Finding
from preclint.text.guard import run_with_deep_stack
from preclint.source.run import check_source
from preclint.text.no_links import LinkOnPath
from preclint.text.safe_io import ChangedOnDisk, replace_checked
from preclint.text.sourcefile import Fix, SourceFile
from preclint.source.suppress import apply_suppressions

MAX_ROUNDS = 10


class _Replace(cst.CSTTransformer):
    """Replaces each fixed node, carrying the fixes made inside it into its replacement: a
    replacement is built from the original node's parts, so without this a fix nested in another
    (``autocast(enabled=autocast())``) would be lost and need another round, one round a level."""

    def __init__(self, fixes: Sequence[Fix]):
        super().__init__()
        self.fixes = {id(fix.node): index for index, fix in enumerate(fixes)}
        self.replacements = [fix.replacement for fix in fixes]
        # id of an original node whose subtree changed -> (its new version, indices of the fixes in it)
        self.changed: Dict[int, tuple] = {}
        self.below: List[Set[int]] = [set()]  # per node being visited: the fixes applied inside it
        self.applied: Set[int] = set()

    def on_visit(self, node) -> bool:
        self.below.append(set())
        return True

    def on_leave(self, original_node, updated_node):
        inside = self.below.pop()
        index = self.fixes.get(id(original_node))
        result = updated_node
        if index is not None:
            carry = _Carry(self.changed)
            result = self.replacements[index].visit(carry)
            inside = carry.carried | {index}
        if result is not original_node:
            self.changed[id(original_node)] = (result, inside)
        self.below[-1] |= inside
        if len(self.below) == 1:
            self.applied = self.below[0]
        return result


class _Carry(cst.CSTTransformer):
    """Puts the new versions of changed original nodes into a replacement that reuses them."""

    def __init__(self, changed: Dict[int, tuple]):
        super().__init__()
        self.changed = changed
        self.carried: Set[int] = set()

    def on_visit(self, node) -> bool:
        return id(node) not in self.changed  # its new version is complete: no need to look inside

    def on_leave(self, original_node, updated_node):
        done = self.changed.get(id(original_node))
        if done is None:
            return updated_node
        self.carried |= done[1]
        return done[0]


def apply_fixes(source: SourceFile, fixes: Sequence[Fix]) -> Tuple[str, int]:
    """The text of ``source`` with ``fixes`` applied (one round), and how many of them it holds (a fix
    inside another's replacement that does not keep the node it fixed is not applied)."""
    replace = _Replace(fixes)
    module = source.module.visit(replace)
    applied = [fixes[index] for index in sorted(replace.applied)]
    add = sorted({name for fix in applied for name in fix.add_imports})
    unused = sorted({pair for fix in applied for pair in fix.unused_imports})
    if add or unused:
        from libcst.codemod import CodemodContext  # a second to import: only when imports change
        from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

        context = CodemodContext()
        for name in add:
            AddImportsVisitor.add_needed_import(context, name)
        module = AddImportsVisitor(context).transform_module(module)
        for module_name, name in unused:
            RemoveImportsVisitor.remove_unused_import(context, module_name, name)
        module = _remover(RemoveImportsVisitor)(context).transform_module(module)
    return module.code, len(applied)


def _remover(base):
    """libcst's RemoveImportsVisitor, except that the comments above an import it removes move to the
    statement that follows (to the end of the block or file when none does) instead of going with it."""

    class KeepComments(base):
        def __init__(self, context):
            super().__init__(context)
            self.pending: List[cst.EmptyLine] = []
            self.moved: Dict[int, List[cst.EmptyLine]] = {}  # id of the statement -> comments it receives

        def on_visit(self, node) -> bool:
            if self.pending and isinstance(node, cst.BaseStatement):
                self.moved[id(node)], self.pending = self.pending, []
            return super().on_visit(node)

        def on_leave(self, original, updated):
            result = super().on_leave(original, updated)
            if isinstance(original, cst.SimpleStatementLine) and (
                    isinstance(result, cst.RemovalSentinel) or isinstance(result, cst.SimpleStatementLine) and not result.body):
                lines = list(original.leading_lines)
                comments = [i for i, line in enumerate(lines) if line.comment]
                self.pending.extend(self.moved.pop(id(original), []) + (lines[:comments[-1] + 1] if comments else []))
            elif id(original) in self.moved and isinstance(result, cst.BaseStatement):
                result = result.with_changes(leading_lines=[*self.moved.pop(id(original)), *result.leading_lines])
            elif self.pending and isinstance(result, (cst.IndentedBlock, cst.Module)):
                result, self.pending = result.with_changes(footer=[*result.footer, *self.pending]), []
            return result

    return KeepComments


@dataclass
class FixResult:
    texts: Dict[str, str] = field(default_factory=dict)  # printed path -> new text, changed files only
    counts: Dict[str, int] = field(default_factory=dict)  # printed path -> fixes applied
    unfinished: List[str] = field(default_factory=list)  # printed paths with fixes left after MAX_ROUNDS

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def fix_file(
    source: SourceFile,
    rules: Sequence,
    config: Config,
    keep: Callable[[Finding], bool] = lambda finding: True,
    unsafe: bool = False,
) -> Optional[tuple]:
    """(new text, fixes applied, whether fixes were left after ``MAX_ROUNDS`` rounds) for one file,
    or None when nothing is fixable. Only findings that
    would be reported get fixed: not those per-file-ignored, suppressed, or dropped by ``keep``; and
    only safe fixes unless ``unsafe``."""
    return run_with_deep_stack(lambda: _fix_file(source, rules, config, keep, unsafe))


def _fix_file(source: SourceFile, rules: Sequence, config: Config, keep: Callable[[Finding], bool],
              unsafe: bool) -> Optional[tuple]:
    text, applied, unfinished = source.text, 0, False
    current = SourceFile(source.path, source.text)  # a fresh parse: fixes refer to its nodes
    for round_number in range(MAX_ROUNDS + 1):
        findings = [
            f for f in check_source(current, rules) if not config.ignored_for_file(current.path, f.code)
        ]
        reported = apply_suppressions(findings, False, texts={current.path: current.text})
        wanted = {id(f) for f in reported if keep(f)}
        fixes = [fix for fix in current.fixes if id(fix.finding) in wanted and (fix.safe or unsafe)]
        if not fixes:
            break
        if round_number == MAX_ROUNDS:  # checked, not applied: the limit is reached
            unfinished = True
            break
        new_text, count = apply_fixes(current, fixes)
        if new_text == current.text:
            break
        applied += count
        current = SourceFile(source.path, new_text)
    if current.text == text:
        return None
    return current.text, applied, unfinished


def fix_run(run, rules: Sequence, config: Config, keep: Callable[[Finding], bool] = lambda f: True,
            unsafe: bool = False) -> FixResult:
    """Fixes for every file of a source run (preclint.source.run.SourceRun) that has a fixable finding
    (with ``unsafe``: a finding of a rule that has fixes)."""
    result = FixResult()
    fixing = {rule.code for rule in rules if getattr(rule, "fixable", False)}
    paths = sorted({
        f.location.path for f in run.findings
        if f.location is not None and (f.fixable or (unsafe and f.code in fixing))
    })
    for path in paths:
        source = run.sources.get(path)
        if source is None or source.decode_failure is not None:
            continue
        fixed = fix_file(source, rules, config, keep, unsafe)
        if fixed is not None:
            result.texts[path], result.counts[path], unfinished = fixed
            if unfinished:
                result.unfinished.append(path)
    return result


def unified_diff(run, result: FixResult, header_path: Callable[[str], str] = str) -> str:
    """The changes as one unified diff (``a/path`` / ``b/path``, each written by ``header_path``: the
    report layer quotes a name that needs it), files in sorted order."""
    chunks: List[str] = []
    for path in sorted(result.texts):
        before = run.sources[path].text.splitlines(keepends=True)
        after = result.texts[path].splitlines(keepends=True)
        for line in difflib.unified_diff(before, after, header_path(f"a/{path}"), header_path(f"b/{path}")):
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def _inside(path: str, roots: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


@dataclass
class Written:
    """What ``write_fixes`` did, by printed path."""

    fixed: List[str] = field(default_factory=list)  # files written with their fixes
    skipped: List[str] = field(default_factory=list)  # "path: not fixed: why" for files left alone on purpose
    failed: List[str] = field(default_factory=list)  # "path: not fixed: ..." for files that could not be written


def write_fixes(run, result: FixResult, tell: Callable[[str], None] = lambda line: None) -> Written:
    """Write the fixed texts, every file whatever happens to the others; ``tell`` hears one line a
    file as it is done (so an interrupted run has said what it changed)."""
    done = Written()
    for path, text in sorted(result.texts.items()):
        source = run.sources[path]
        filename = run.filenames.get(path) or source.filename or path
        count = result.counts.get(path, 0)
        if run.roots and not _inside(filename, run.roots):
            done.skipped.append(f"{path}: not fixed: a symlink to a file outside the checked paths")
            continue
        try:
            replace_checked(filename, text.encode(source.encoding), expected=source.data)
        except ChangedOnDisk:
            done.skipped.append(f"{path}: not fixed: it changed on disk while preclint ran")
            continue
        except LinkOnPath as exc:
            line = (f"{path}: not fixed: {exc.link} is a symbolic link, and preclint does not write through links "
                    "(a repository can aim one at any directory); the file is unchanged")
            done.failed.append(line)
            tell(f"preclint: error: {line}")
            continue
        except OSError as exc:
            line = f"{path}: not fixed: cannot write it: {exc.strerror or exc}; the file is unchanged"
            done.failed.append(line)
            tell(f"preclint: error: {line}")
            continue
        done.fixed.append(path)
        tell(f"Fixed {count} finding{'s' if count != 1 else ''} in {path}.")
    return done
