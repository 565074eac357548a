"""One Python file as the source rules see it: its text, its libcst tree (parsed once, lazily), the
index of what the rules read, and the findings and fixes the rules report against it.

Nothing here imports or executes the file, and nothing imports torch.
"""
from __future__ import annotations

import ast
import io
import os
import tokenize
from dataclasses import dataclass
from typing import List, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from preclint.findings import Finding, Location


class ParseFailure(Exception):
    """The file is not Python that libcst can parse (or not text at all)."""

    def __init__(self, message: str, line: int = 1, column: int = 1):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


def decode(data: bytes) -> str:
    """Bytes to text the way Python reads source (PEP 263 cookie, BOM); newlines are kept as they are
    so that a fix writes back the same line endings."""
    return decode_with_encoding(data)[0]


def decode_with_encoding(data: bytes) -> Tuple[str, str]:
    """(text, encoding to write it back with); a BOM is kept through the "utf-8-sig" codec."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise ParseFailure(f"cannot decode the file: {exc}") from None


@dataclass
class Fix:
    finding: Finding
    node: cst.CSTNode
    replacement: cst.CSTNode
    add_imports: Tuple[str, ...] = ()
    unused_imports: Tuple[Tuple[str, str], ...] = ()


class SourceFile:
    """``path`` is the path as printed (relative to the working directory)."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.filename: Optional[str] = None  # where it was read from, when it came from disk
        self.decode_failure: Optional[ParseFailure] = None
        self.encoding = "utf-8"
        self._module: Optional[cst.Module] = None
        self._wrapper: Optional[MetadataWrapper] = None
        self._positions = None
        self._index = None
        self._evidence = None
        # fixes by finding; preclint.source.fix applies those of the findings that survive
        # suppressions and the baseline
        self.fixes: List[Fix] = []

    @classmethod
    def read(cls, filename: str, display: str) -> "SourceFile":
        """Read ``filename``; OSError propagates (the caller decides if that is a user error)."""
        with open(filename, "rb") as handle:
            data = handle.read()
        source = cls(display, "")
        source.filename = filename
        try:
            source.text, source.encoding = decode_with_encoding(data)
        except ParseFailure as failure:
            source.decode_failure = failure
        return source

    @property
    def parsed(self) -> bool:
        """Whether the file has been parsed (the prefilter skips files no selected rule can match)."""
        return self._module is not None

    @property
    def module(self) -> cst.Module:
        if self.decode_failure is not None:
            raise self.decode_failure
        if self._module is None:
            try:
                self._module = cst.parse_module(self.text)
            except cst.ParserSyntaxError as exc:
                raise self._syntax_error(exc) from None
            except (RecursionError, MemoryError, ValueError) as exc:  # libcst's native parser's limits
                raise ParseFailure(f"cannot parse the file: {exc}") from None
        return self._module

    def _syntax_error(self, exc: "cst.ParserSyntaxError") -> ParseFailure:
        # Python's own parser names the error and its position more precisely than libcst's; it only
        # runs on files that failed, so it costs nothing on the others
        try:
            compile(self.text, self.path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as error:
            return ParseFailure(f"cannot parse the file: {error.msg}", error.lineno or 1, error.offset or 1)
        except (ValueError, RecursionError, MemoryError):
            pass
        return ParseFailure(f"cannot parse the file: {exc.message}", exc.raw_line, exc.raw_column + 1)

    @property
    def index(self):
        if self._index is None:
            from preclint.source.index import build_index

            self._index = build_index(self.module)
        return self._index

    @property
    def evidence(self):
        """Reduced precision the code shows (preclint.source.evidence.EvidenceMap)."""
        if self._evidence is None:
            from preclint.source.evidence import EvidenceMap

            self._evidence = EvidenceMap(self.index)
        return self._evidence

    def location(self, node: cst.CSTNode) -> Location:
        """Where ``node`` starts. Positions are computed once per file, and only for files that have
        something to report."""
        if self._positions is None:
            self._wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = self._wrapper.resolve(PositionProvider)
        start = self._positions[node].start
        return Location(self.path, start.line, start.column + 1)

    def report(
        self,
        rule,
        node: cst.CSTNode,
        message: str,
        fix: str,
        severity: Optional[str] = None,
        precisions: tuple = (),
        replacement: Optional[cst.CSTNode] = None,
        add_imports: Tuple[str, ...] = (),
        unused_imports: Tuple[Tuple[str, str], ...] = (),
    ) -> Finding:
        """A finding of ``rule`` at ``node`` (the rule yields it). ``replacement``, a node to put in
        ``node``'s place, makes it fixable with ``--fix``; ``add_imports`` are modules the replacement
        needs imported, ``unused_imports`` (module, name) pairs of ``from module import name`` that
        the fix may leave unused (removed only if nothing else uses them)."""
        finding = Finding(
            code=rule.code,
            name=rule.name,
            severity=severity or rule.severity,
            message=message,
            fix=fix,
            location=self.location(node),
            precisions=tuple(precisions),
            fixable=replacement is not None,
        )
        if replacement is not None:
            self.fixes.append(Fix(finding, node, replacement, tuple(add_imports), tuple(unused_imports)))
        return finding

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""

    @property
    def is_test(self) -> bool:
        """Tests and pytest's conftest files: code that runs under a test runner, not on import by users."""
        parts = self.path.replace(os.sep, "/").split("/")
        base = parts[-1]
        return (
            base.startswith("test_")
            or base.endswith("_test.py")
            or base == "conftest.py"
            or any(part in ("test", "tests", "testing") for part in parts[:-1])
        )

    @property
    def is_script(self) -> bool:
        """A file made to be run, not imported: it starts with a shebang line."""
        return self.text.startswith("#!")
