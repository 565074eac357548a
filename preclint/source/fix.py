"""``--fix`` and ``--diff``: apply the safe autofixes of the reported findings.

A fix replaces one node of the libcst tree, so everything else in the file keeps its bytes (comments,
quotes, blank lines, line endings, encoding). Fixes are applied in rounds until none is left, since
one replacement can hide another inside it. Only safe fixes exist: a rule offers a replacement only
where it can show the behaviour is the same (see each rule's Fix section).

Files are written in place (preclint.source.safe_io.write_in_place): owner, mode and hard links stay;
a file that changed on disk since it was read is left alone, and so is a file reached through a
symlink that leads outside the paths the run was given.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import libcst as cst

from preclint.config import Config
from preclint.errors import UserError
from preclint.findings import Finding
from preclint.source.guard import run_with_deep_stack
from preclint.source.run import check_source
from preclint.source.safe_io import ChangedOnDisk, write_in_place
from preclint.source.sourcefile import Fix, SourceFile
from preclint.source.suppress import apply_suppressions

MAX_ROUNDS = 10


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: Dict[int, cst.CSTNode]):
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        return self.replacements.get(id(original_node), updated_node)


def apply_fixes(source: SourceFile, fixes: Sequence[Fix]) -> str:
    """The text of ``source`` with ``fixes`` applied (one round)."""
    module = source.module.visit(_Replace({id(fix.node): fix.replacement for fix in fixes}))
    add = sorted({name for fix in fixes for name in fix.add_imports})
    unused = sorted({pair for fix in fixes for pair in fix.unused_imports})
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
    return module.code


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
    """(new text, fixes applied) for one file, or None when nothing is fixable. Only findings that
    would be reported get fixed: not those per-file-ignored, suppressed, or dropped by ``keep``; and
    only safe fixes unless ``unsafe``."""
    return run_with_deep_stack(lambda: _fix_file(source, rules, config, keep, unsafe))


def _fix_file(source: SourceFile, rules: Sequence, config: Config, keep: Callable[[Finding], bool],
              unsafe: bool) -> Optional[tuple]:
    text, applied = source.text, 0
    current = SourceFile(source.path, source.text)  # a fresh parse: fixes refer to its nodes
    for _ in range(MAX_ROUNDS):
        findings = [
            f for f in check_source(current, rules) if not config.ignored_for_file(current.path, f.code)
        ]
        reported = apply_suppressions(findings, False, texts={current.path: current.text})
        wanted = {id(f) for f in reported if keep(f)}
        fixes = [fix for fix in current.fixes if id(fix.finding) in wanted and (fix.safe or unsafe)]
        if not fixes:
            break
        new_text = apply_fixes(current, fixes)
        if new_text == current.text:
            break
        applied += len(fixes)
        current = SourceFile(source.path, new_text)
    if current.text == text:
        return None
    return current.text, applied


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
            result.texts[path], result.counts[path] = fixed
    return result


def unified_diff(run, result: FixResult) -> str:
    """The changes as one unified diff (``a/path`` / ``b/path``), files in sorted order."""
    chunks: List[str] = []
    for path in sorted(result.texts):
        before = run.sources[path].text.splitlines(keepends=True)
        after = result.texts[path].splitlines(keepends=True)
        for line in difflib.unified_diff(before, after, f"a/{path}", f"b/{path}"):
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def _inside(path: str, roots: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def write_fixes(run, result: FixResult) -> List[str]:
    """Write the fixed texts; returns notes on files left unchanged (and why)."""
    notes: List[str] = []
    for path, text in sorted(result.texts.items()):
        source = run.sources[path]
        filename = run.filenames.get(path) or source.filename or path
        if run.roots and not _inside(filename, run.roots):
            notes.append(f"{path}: not fixed: a symlink to a file outside the checked paths")
            continue
        try:
            write_in_place(filename, text.encode(source.encoding), expected=source.data)
        except ChangedOnDisk:
            notes.append(f"{path}: not fixed: it changed on disk while preclint ran")
        except OSError as exc:
            raise UserError(f"{path}: cannot write the fixes: {exc.strerror or exc} (the file is unchanged)") from None
    return notes
