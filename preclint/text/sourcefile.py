"""One Python file as the source rules see it: its text, its libcst tree (parsed once, lazily), the
index of what the rules read, and the findings and fixes the rules report against it.

Nothing here imports or executes the file, and nothing imports torch.
"""
from __future__ import annotations

import io
import os
import re
import tokenize
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

from preclint.core.findings import Finding, Location
from preclint.text.guard import MAX_DEPTH, blank, elide, judge
from preclint.text.safe_io import read_regular

if TYPE_CHECKING:  # libcst (a third of a second to import) only where a file is parsed
    import libcst as cst

    from preclint.text.positions import Positions


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
    safe: bool = True  # provably keeps the behaviour; an unsafe fix is applied only on request


class SourceFile:
    """``path`` is the path as printed (relative to the working directory)."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.filename: Optional[str] = None  # where it was read from, when it came from disk
        self.decode_failure: Optional[ParseFailure] = None
        self.encoding = "utf-8"
        self.data: Optional[bytes] = None  # the bytes read, when read from disk
        # what can make an expression matter to the rules that will read this file; an expression
        # too deep for libcst that holds none of it is elided (preclint.text.guard). None: every
        # expression matters
        self.words: Optional["re.Pattern[str]"] = None
        self.elided = 0  # how many expressions were elided: the file then offers no fixes
        # (line, depth) of expressions elided although the rules look inside: too deep for libcst's time
        self.unchecked: List[Tuple[int, int]] = []
        # where findings can be: a top-level function or class that holds none of this is not given
        # to libcst (preclint.source.run.check_source(focus=True)); None: parse everything
        self.focus: Optional["re.Pattern[str]"] = None
        self._module: Optional[cst.Module] = None
        self._parsed_text = ""  # what libcst parsed: the text, with what focus and the guard blanked
        self._positions: Optional[Positions] = None
        self._index = None
        self._evidence = None
        # fixes by finding; preclint.source.fix applies those of the findings that survive
        # suppressions and the baseline
        self.fixes: List[Fix] = []

    @classmethod
    def read(cls, filename: str, display: str) -> "SourceFile":
        """Read ``filename``, a regular file; OSError propagates (NotRegularFile for a FIFO or a
        device), and the caller decides if that is a user error."""
        return cls.from_bytes(read_regular(filename), display, filename)

    @classmethod
    def from_bytes(cls, data: bytes, display: str, filename: Optional[str] = None) -> "SourceFile":
        source = cls(display, "")
        source.filename = filename
        source.data = data
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
        """The libcst tree, parsed once. Call it on a thread from ``guard.run_with_deep_stack``
        (``preclint.source.run.check_source`` does): deep files need its stack."""
        if self.decode_failure is not None:
            raise self.decode_failure
        if self._module is None:
            self._module = self._parse()
        return self._module

    def _parse(self) -> cst.Module:
        verdict = judge(self.text, self.path)
        if verdict.error is not None and verdict.final:
            message, line, column = verdict.error
            raise ParseFailure(f"cannot parse the file: {message}", line, column)
        text = self.text
        if self.focus is not None:
            focus = self.focus
            # names the module binds to what the rules look for (``from torch.cuda.amp import
            # autocast``, ``EPS = 1e-8``) stand for it in the functions that use them
            names = {name for names, start, end in verdict.bindings if focus.search(text, start, end)
                     for name in names if name != "torch"}
            if names:
                words = "|".join(re.escape(name) for name in sorted(names))
                focus = re.compile(f"{focus.pattern}|(?<![A-Za-z0-9_])(?:{words})(?![A-Za-z0-9_])")
            quiet = [(start, end) for start, end in verdict.definitions if not focus.search(text, start, end)]
            if quiet:
                text = blank(text, quiet)
        if verdict.deep:
            quiet = [
                deep for deep in verdict.deep
                if deep.elidable and (deep.depth > MAX_DEPTH or self.words is not None
                                      and not self.words.search(text, deep.start, deep.end))
            ]
            self.unchecked = [(text.count("\n", 0, deep.start) + 1, deep.depth) for deep in quiet
                              if deep.depth > MAX_DEPTH and (self.words is None or self.words.search(text, deep.start, deep.end))]
            if quiet:
                text = elide(text, quiet)
                self.elided = len(quiet)
        self._parsed_text = text
        import libcst as cst

        try:
            return cst.parse_module(text)
        except (cst.ParserSyntaxError, cst.CSTValidationError) as exc:
            # (libcst's parser builds nodes that refuse what CPython refuses too: a name with a
            # character no identifier may hold)
            if verdict.error is not None:  # CPython names the error and its place more precisely
                message, line, column = verdict.error
                raise ParseFailure(f"cannot parse the file: {message}", line, column) from None
            if isinstance(exc, cst.CSTValidationError):
                raise ParseFailure(f"cannot parse the file: {exc}") from None
            raise ParseFailure(f"cannot parse the file: {exc.message}", exc.raw_line, exc.raw_column + 1) from None
        except (RecursionError, MemoryError, ValueError) as exc:  # libcst's native parser's limits
            raise ParseFailure(f"cannot parse the file: {exc}") from None

    @property
    def index(self):
        if self._index is None:
            from preclint.text.index import build_index  # lazy: libcst only where a source file is parsed

            self._index = build_index(self.module)
        return self._index

    @property
    def evidence(self):
        """Reduced precision the code shows (preclint.text.evidence.EvidenceMap)."""
        if self._evidence is None:
            from preclint.text.evidence import EvidenceMap  # lazy: libcst only where a source file is parsed

            self._evidence = EvidenceMap(self.index)
        return self._evidence

    def location(self, node: cst.CSTNode) -> Location:
        """Where ``node`` starts. Positions are computed once per file, and only for files that have
        something to report."""
        start = self._position(node).start
        return Location(self.path, start.line, start.column + 1)

    def _position(self, node: cst.CSTNode):
        if self._positions is None:
            from preclint.text.positions import Positions  # lazy: libcst only where a source file is parsed

            self._positions = Positions(self.module, self._parsed_text)
        return self._positions[node]

    def report(
        self,
        rule,
        node: cst.CSTNode,
        message: str,
        fix: str,
        *,
        severity: Optional[str] = None,
        precisions: tuple = (),
        replacement: Optional[cst.CSTNode] = None,
        add_imports: Tuple[str, ...] = (),
        unused_imports: Tuple[Tuple[str, str], ...] = (),
        safe: bool = True,
    ) -> Finding:
        """A finding of ``rule`` at ``node`` (the rule yields it). ``replacement``, a node to put in
        ``node``'s place, makes it fixable with ``--fix``; ``add_imports`` are modules the replacement
        needs imported, ``unused_imports`` (module, name) pairs of ``from module import name`` that
        the fix may leave unused (removed only if nothing else uses them). A fix that the rule cannot
        show keeps the behaviour is ``safe=False``: applied only with ``--unsafe-fixes``, and the
        finding is not marked fixable."""
        finding = Finding(
            code=rule.code,
            name=rule.name,
            severity=severity or rule.severity,
            message=message,
            fix=fix,
            location=self.location(node),
            precisions=tuple(precisions),
            fixable=replacement is not None and safe,
        )
        if replacement is not None:
            self.fixes.append(Fix(finding, node, replacement, tuple(add_imports), tuple(unused_imports), safe))
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
