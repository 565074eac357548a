"""Where a node of a parsed file is (line, column), computed for the statement around it only.

libcst's PositionProvider generates the code of the whole module to count lines and columns, and
MetadataWrapper walks the whole tree once more after it; on a large module that reports one finding
(a 460 kB test file, one class) this cost more than parsing it. A finding's node lies in a
statement of the module, or of a class or function body (a method): the positions inside that
statement are those of a small module holding only the statement and the headers of the classes and
functions around it, shifted by the line the statement starts at in the file. That line is found
where the statement's code occurs in the text, which libcst reproduces exactly; when the code occurs
more than once (two identical statements), the statement around it is located instead, and when
nothing lines up, the whole module's positions are computed as before.

The code is looked for at the starts of the lines that hold its rarest line (the text's lines are
indexed once), so a statement costs its own size, not a search of the whole text; its positions,
its whitespace-inclusive range and its code come from one generation of its code (MetadataWrapper
takes three, and a walk of the tree). Once the code generated and compared for statements located
one by one reaches one and a half times the text's length, the whole module's positions are
computed instead and answer every later node: a file with thousands of findings takes time linear
in its size.
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider, WhitespaceInclusivePositionProvider

from preclint.text.index import children

try:  # the codegen state of libcst's PositionProvider (libcst 1.x keeps it here)
    from libcst.metadata.position_provider import PositionProvidingCodegenState
except ImportError:  # pragma: no cover - another libcst: its MetadataWrapper, as before
    PositionProvidingCodegenState = None

_NEWLINE = re.compile(r"\r\n?|\n")  # as libcst counts lines
_NESTS = (cst.ClassDef, cst.FunctionDef)  # bodies a statement is located in
MIN_BUDGET = 1 << 16  # characters: a small file's statements are always located one by one


class Positions:
    """Positions of the nodes of ``module``, parsed from ``text`` (which its code reproduces)."""

    def __init__(self, module: cst.Module, text: str):
        self.module = module
        self.text = text
        self._parents: Optional[Dict[int, cst.CSTNode]] = None
        self._by_statement: Dict[int, Tuple[Mapping[cst.CSTNode, CodeRange], int]] = {}
        self._whole: Optional[Mapping[cst.CSTNode, CodeRange]] = None
        self._line_starts: List[int] = []
        self._lines: Optional[Dict[str, List[int]]] = None  # a line of the text, ending included -> its indices
        # characters of code that statements located one by one may generate and compare before the
        # whole module's positions are computed instead
        self.budget = max(len(text) * 3 // 2, MIN_BUDGET)
        self.spent = 0

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if self._whole is not None:
            return self._whole[node]
        chain = self._chain(node)
        while chain:  # the innermost statement, else the one around it (its code may be unique)
            located = self._by_statement.get(id(chain[-1]))
            if located is None:
                if self.spent > self.budget:
                    break
                located = self._by_statement[id(chain[-1])] = self._locate(chain)
            positions, shift = located
            found = positions.get(node)
            if found is not None:
                return CodeRange(CodePosition(found.start.line + shift, found.start.column),
                                 CodePosition(found.end.line + shift, found.end.column))
            chain = chain[:-1]
        return self._everything()[node]

    def _everything(self) -> Mapping[cst.CSTNode, CodeRange]:
        if self._whole is None:
            self._whole = _generate(self.module)[0]
            self._by_statement.clear()  # answered by the whole module from now on
        return self._whole

    def _chain(self, node: cst.CSTNode) -> List[cst.CSTNode]:
        """The statements that hold ``node``: one of the module's, then one of its body if it is a
        class or function, and so on; empty when the node is not in a statement."""
        if self._parents is None:
            self._parents = {}
            stack: List[cst.CSTNode] = [self.module]
            while stack:
                parent = stack.pop()
                for child in children(parent):
                    self._parents[id(child)] = parent
                    stack.append(child)
        ancestors = [node]
        while id(ancestors[-1]) in self._parents:
            ancestors.append(self._parents[id(ancestors[-1])])
        if ancestors[-1] is not self.module:
            return []
        ancestors.reverse()  # module, statement, ...
        chain: List[cst.CSTNode] = []
        for above, statement in zip(ancestors, ancestors[1:]):
            if above is self.module or (
                isinstance(above, cst.IndentedBlock) and chain and isinstance(chain[-1], _NESTS)
                and chain[-1].body is above
            ):
                chain.append(statement)
            elif chain and isinstance(above, cst.IndentedBlock):
                break  # a block of an if, a loop, a with: located with the statement that holds it
        return chain

    def _locate(self, chain: List[cst.CSTNode]) -> Tuple[Mapping[cst.CSTNode, CodeRange], int]:
        """The positions within a module of ``chain[-1]`` and the headers around it, and the lines to add."""
        statement = chain[-1]
        inner: cst.CSTNode = statement
        for outer in reversed(chain[:-1]):
            inner = outer.with_changes(body=outer.body.with_changes(body=[inner]))
        small = self.module.with_changes(header=[], body=[inner], footer=[])
        positions, around, generated = _generate(small, statement)
        self.spent += len(generated)
        starts = [0] + [match.end() for match in _NEWLINE.finditer(generated)]  # of each line
        if around.start.column != 0 or around.end.column != 0 or around.end.line > len(starts):
            return {}, 0
        first, last = around.start.line - 1, around.end.line - 1
        lines = [generated[starts[i] : starts[i + 1]] for i in range(first, last)]
        line = self._only_line_holding(lines)
        if line is None:
            return {}, 0
        return positions, line - around.start.line

    def _only_line_holding(self, lines: List[str]) -> Optional[int]:
        """The 1-based line of the text at which ``lines`` (each with its line break) occur, if
        they occur at exactly one line start. Only the places of their rarest line are compared."""
        if not lines:
            return None
        if self._lines is None:
            self._index_lines()
        places = [self._lines.get(line, ()) for line in lines]
        rarest = min(range(len(lines)), key=lambda i: len(places[i]))
        code = "".join(lines)
        found: Optional[int] = None
        for place in places[rarest]:
            first = place - rarest
            if first < 0:
                continue
            self.spent += len(code)
            if self.text.startswith(code, self._line_starts[first]):
                if found is not None:
                    return None  # twice: the statement around it is located instead
                found = first + 1
            if self.spent > self.budget:
                return None
        return found

    def _index_lines(self) -> None:
        self._line_starts = [0] + [match.end() for match in _NEWLINE.finditer(self.text)]
        ends = self._line_starts[1:] + [len(self.text)]
        self._lines = {}
        for i, (start, end) in enumerate(zip(self._line_starts, ends)):
            if end > start:
                self._lines.setdefault(self.text[start:end], []).append(i)


class _Computed:
    """Where libcst's codegen state for PositionProvider records the positions it computes."""

    def __init__(self) -> None:
        self._computed: Dict[cst.CSTNode, CodeRange] = {}


_StatementCodegen = None
if PositionProvidingCodegenState is not None:
    class _StatementCodegen(PositionProvidingCodegenState):  # type: ignore[no-redef]
        """PositionProvider's codegen state, keeping also the whitespace-inclusive range of one node."""

        target: Optional[cst.CSTNode] = None
        target_range: Optional[CodeRange] = None

        def after_codegen(self, node: cst.CSTNode) -> None:
            if node is self.target:
                self.target_range = CodeRange(self._stack[-1], CodePosition(self.line, self.column))
            super().after_codegen(node)


def _generate(
    module: cst.Module, statement: Optional[cst.CSTNode] = None
) -> Tuple[Mapping[cst.CSTNode, CodeRange], Optional[CodeRange], str]:
    """PositionProvider's positions in ``module``, the whitespace-inclusive range of ``statement``
    and the code, from one generation of the code (libcst's MetadataWrapper generates it once per
    provider, once more for the text, and walks the whole tree once besides); libcst's own way
    where its codegen state is not what this expects."""
    if _StatementCodegen is not None:
        try:
            computed = _Computed()
            state = _StatementCodegen(default_indent=module.default_indent, default_newline=module.default_newline,
                                      provider=computed)
            state.target = statement
            module._codegen(state)
            if statement is None or state.target_range is not None:
                return computed._computed, state.target_range, "".join(state.tokens)
        except (AttributeError, TypeError):
            pass
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    resolved = wrapper.resolve_many([PositionProvider, WhitespaceInclusivePositionProvider])
    around = resolved[WhitespaceInclusivePositionProvider][statement] if statement is not None else None
    return resolved[PositionProvider], around, module.code
