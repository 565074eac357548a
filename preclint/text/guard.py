"""Keeping libcst's native parser inside what it can take, so that no file crashes or stalls a run.

libcst parses with a recursive parser written in Rust, on the calling thread's stack. Deeply nested
code makes it overflow that stack, which kills the whole process (SIGSEGV: 3,000 nested brackets,
an 8,000-term sum, 20,000 unary minuses), and long left-associative chains cost it super-quadratic
time, because its left-recursion cache clones the growing expression at every step (a 4,000-term sum
takes 4 s, 8,000 terms 50 s; 4,000 chained attributes 8 s). Python code in libcst (positions,
code generation) and in the rules recurses per level of nesting too.

So every file is handled in three steps:

1. CPython's own parser (``compile(..., PyCF_ONLY_AST)``, about a tenth of libcst's time) judges
   the file first. What CPython cannot compile is reported with CPython's message and never reaches
   libcst: more than 200 nested brackets, "too complex" expressions. A SyntaxError that may be newer
   syntax than the running Python knows goes on to libcst only when no statement is long enough to
   nest deeply.
2. Expressions longer than a few hundred characters have their nesting measured on CPython's tree,
   as libcst would nest them (``a and b and c`` and ``"a" "b" "c"`` nest in libcst, not in CPython).
   An expression deeper than ``DEPTH_BUDGET`` is *elided* when it holds none of the words the
   selected rules look for (the same argument as the per-file prefilter: it cannot hold a finding):
   its text is blanked to ``(0   ...)`` of the same length and line structure, so every other
   position in the file is unchanged. A file with an elided expression offers no fixes.
3. libcst parses, and the rules run, on a thread with a large stack and a raised recursion limit,
   so that what remains (at most ``DEPTH_BUDGET`` deep, or deeper where a rule needs to look inside)
   fits, instead of crashing or raising RecursionError.
"""
from __future__ import annotations

import ast
import re
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple, TypeVar

from preclint.text import lexical

T = TypeVar("T")

DEPTH_BUDGET = 1000  # libcst parses 1,000 levels in ~0.1-0.4 s (sum, unary, attribute chains)
# Deeper than this, an expression is elided even where the rules would look inside (the file then gets
# a PCL599 naming it): libcst's time grows faster than quadratically (4,000 terms 5 s, 10,000 minutes)
MAX_DEPTH = 3000
LONG_EXPRESSION = 600  # characters: a shorter expression cannot nest deeper than the budget's reach
STACK_SIZE = 512 << 20  # bytes of the checking thread's stack: virtual memory, touched only as used
RECURSION_LIMIT = 200_000


def run_with_deep_stack(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread with a ``STACK_SIZE`` stack and a raised recursion limit; its exception,
    if any, is raised here. The limit is process-wide while the thread runs: callers do not recurse
    meanwhile (they wait on the thread)."""
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    previous_limit = sys.getrecursionlimit()
    try:
        previous_size = threading.stack_size(STACK_SIZE)
    except (ValueError, RuntimeError):  # a platform that cannot: run here, with the usual limits
        return fn()
    # raised before the thread starts: a thread takes the limit in force when it is created
    sys.setrecursionlimit(max(previous_limit, RECURSION_LIMIT))
    try:
        thread = threading.Thread(target=target, name="preclint-check", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no memory for such a stack (strict overcommit): the usual one
            thread = None
        finally:
            threading.stack_size(previous_size)
        if thread is not None:
            thread.join()
    finally:
        sys.setrecursionlimit(previous_limit)
    if thread is None:
        return fn()
    if "error" in result:
        raise result["error"]
    return result["value"]


@dataclass(frozen=True)
class DeepExpression:
    start: int  # character offsets in the text
    end: int
    depth: int  # as libcst would nest it
    elidable: bool  # read, not assigned to: a placeholder can stand in for it


@dataclass
class Verdict:
    """What CPython's parser says about a text, for libcst's sake."""

    error: Optional[Tuple[str, int, int]] = None  # (message, line, column) when CPython cannot compile it
    final: bool = False  # the error is a limit of nesting: libcst must not try
    deep: List[DeepExpression] = field(default_factory=list)
    definitions: List[Tuple[int, int]] = field(default_factory=list)  # (start, end) of top-level def/class
    # (names bound, start, end) of top-level imports and assignments
    bindings: List[Tuple[Tuple[str, ...], int, int]] = field(default_factory=list)


def judge(text: str, filename: str = "<file>") -> Verdict:
    """CPython's verdict on ``text`` and its expressions deeper than ``DEPTH_BUDGET``. Run it with
    ``run_with_deep_stack``: CPython's own limits on nesting then are those of the running Python.
    Never raises for what the text holds: what cannot be measured is a final error (the file is
    reported as one preclint cannot check)."""
    nul = text.find("\0")
    if nul >= 0:  # CPython refuses it (ValueError before 3.12, SyntaxError since), and so does libcst
        line = text.count("\n", 0, nul) + 1
        return Verdict(("source code cannot contain null bytes", line, nul - text.rfind("\n", 0, nul)), final=True)
    try:
        return _judge(text, filename)
    except Exception as exc:  # a limit of the measuring itself: the file is not checked, the run goes on
        reason = " ".join(str(exc).split())
        return Verdict((f"its nesting could not be measured ({type(exc).__name__}{': ' + reason if reason else ''})",
                        1, 1), final=True)


def _judge(text: str, filename: str) -> Verdict:
    try:
        with warnings.catch_warnings():  # the checked file's SyntaxWarnings are not preclint's to print
            warnings.simplefilter("ignore")
            tree = compile(text, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        message = exc.msg or "invalid syntax"
        nesting = "nested" in message or "too complex" in message
        if not nesting and lexical.most_tokens_in_a_statement(text, enough=DEPTH_BUDGET) > DEPTH_BUDGET:
            nesting = True  # newer syntax or not, libcst must not see what may nest this deep
        return Verdict((message, exc.lineno or 1, exc.offset or 1), final=nesting)
    except (RecursionError, MemoryError) as exc:
        what = "too deeply nested" if isinstance(exc, RecursionError) else "too complex"
        return Verdict((f"Python cannot compile it either: expressions are {what}", 1, 1), final=True)
    except ValueError as exc:  # what else CPython refuses before parsing
        return Verdict((str(exc), 1, 1), final=True)
    verdict = Verdict()
    measure = _Measure(text)
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([statement.lineno] + [d.lineno for d in statement.decorator_list])
            verdict.definitions.append((measure.offset(first, 0), measure.span(statement)[1]))
        elif isinstance(statement, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names = _bound(statement)
            if names:
                verdict.bindings.append((names, *measure.span(statement)))
    for expression in _long_expressions(tree, measure):
        for node, depth in _deep_parts(expression, measure):
            start, end = measure.span(node)
            elidable = isinstance(getattr(node, "ctx", ast.Load()), ast.Load)
            verdict.deep.append(DeepExpression(start, end, depth, elidable))
    return verdict


def _bound(statement: ast.stmt) -> Tuple[str, ...]:
    """The names a top-level import or assignment binds."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return tuple((alias.asname or alias.name).split(".")[0] for alias in statement.names if alias.name != "*")
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    return tuple(node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name))


def blank(text: str, spans: List[Tuple[int, int]]) -> str:
    """``text`` with each span's characters turned to spaces, its line breaks kept: every position
    outside the spans stays where it was."""
    pieces = []
    last = 0
    for start, end in sorted(spans):
        if start < last:
            continue
        pieces += [text[last:start], "".join(c if c in "\r\n" else " " for c in text[start:end])]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def elide(text: str, spans: List[DeepExpression]) -> str:
    """``text`` with each span blanked to a parenthesised ``0`` of the same length and newlines."""
    pieces = []
    last = 0
    for start, end in sorted((span.start, span.end) for span in spans):
        if start < last or end - start < 3:
            continue
        body = "".join(c if c in "\r\n" else " " for c in text[start + 2 : end - 1])
        pieces += [text[last:start], "(0", body, ")"]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


# ---------------------------------------------------------------------------- measuring

# nodes that nest into each other as one chain in libcst: a chain is elided from its outermost node
_CHAINS = (
    (ast.BinOp,), (ast.UnaryOp,), (ast.BoolOp,), (ast.IfExp,), (ast.Lambda,), (ast.Await,),
    (ast.Attribute, ast.Call, ast.Subscript, ast.Starred),
)


def _family(node: ast.AST) -> Optional[tuple]:
    for family in _CHAINS:
        if isinstance(node, family):
            return family
    return None


class _Measure:
    """Character offsets of CPython's positions in one text (line starts found once, lazily)."""

    def __init__(self, text: str):
        self.text = text
        self._starts: Optional[List[int]] = None

    def offset(self, line: int, byte_column: int) -> int:
        """The character offset of (1-based line, UTF-8 byte column)."""
        if self._starts is None:
            self._starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", self.text)]
        begin = self._starts[line - 1]
        end = self._starts[line] if line < len(self._starts) else len(self.text)
        line_text = self.text[begin:end]
        if line_text.isascii():
            return begin + byte_column
        return begin + len(line_text.encode("utf-8", "surrogatepass")[:byte_column].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> Tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def longer_than(self, node: ast.AST, size: int) -> bool:
        if getattr(node, "end_lineno", None) is None:
            return False
        if node.end_lineno == node.lineno:
            return (node.end_col_offset or 0) - node.col_offset > size  # bytes: at least as many as characters
        start, end = self.span(node)
        return end - start > size

    def string_literals(self, node: ast.AST) -> int:
        """How many string literals make up a string constant (implicit concatenation: libcst nests
        them one level each). One, unless its text holds its own quote inside."""
        start, end = self.span(node)
        segment = self.text[start:end]
        body = segment.lstrip("rRbBuUfF")
        quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
        if quote and body.endswith(quote) and quote not in body[len(quote) : -len(quote)]:
            return 1
        return max(lexical.string_literals(segment), 1)


def _long_expressions(tree: ast.AST, measure: _Measure):
    """The outermost expressions of each statement whose source spans more than LONG_EXPRESSION
    characters: a shorter one cannot nest deeper than the budget, as nesting needs a token a level."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                if measure.longer_than(child, LONG_EXPRESSION):
                    yield child
            else:
                stack.append(child)


def _deep_parts(root: ast.expr, measure: _Measure) -> List[Tuple[ast.expr, int]]:
    """The chains below ``root`` (or ``root`` itself) that libcst would nest deeper than the budget,
    each as its outermost node and its depth. Depth is counted as libcst nests: a chain of n
    operands of ``and``/``or`` is n - 1 levels (CPython keeps them in one node), and implicitly
    concatenated strings one level a string."""
    depth = {}
    order = []
    stack = [root]
    while stack:  # pre-order, then depths bottom-up
        node = stack.pop()
        order.append(node)
        if not isinstance(node, ast.JoinedStr):  # CPython < 3.12 misplaces what is inside f-strings
            stack.extend(ast.iter_child_nodes(node))
    for node in reversed(order):
        own = 1
        if isinstance(node, ast.BoolOp):
            own += len(node.values) - 2
        elif isinstance(node, (ast.Constant, ast.JoinedStr)) and measure.longer_than(node, DEPTH_BUDGET):
            own += measure.string_literals(node) - 1
        below = 0 if isinstance(node, ast.JoinedStr) else max((depth.get(id(c), 0) for c in ast.iter_child_nodes(node)), default=0)
        depth[id(node)] = own + below
    found = []
    frontier = [root]
    while frontier:
        node = frontier.pop()
        if depth.get(id(node), 0) <= DEPTH_BUDGET:
            continue
        family = _family(node)
        children = [c for c in ast.iter_child_nodes(node) if depth.get(id(c), 0) > DEPTH_BUDGET]
        if family is None or not any(isinstance(c, family) for c in children):
            if not children or isinstance(node, (ast.BoolOp, ast.Constant)):
                found.append((node, depth[id(node)]))  # deep by itself
            else:
                frontier.extend(children)  # a container: look at what makes it deep
        else:
            found.append((node, depth[id(node)]))  # the outermost node of a deep chain
    return found
