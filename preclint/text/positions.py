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
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider, WhitespaceInclusivePositionProvider

from preclint.text.index import children

_NEWLINE = re.compile(r"\r\n?|\n")  # as libcst counts lines
_NESTS = (cst.ClassDef, cst.FunctionDef)  # bodies a statement is located in


class Positions:
    """Positions of the nodes of ``module``, parsed from ``text`` (which its code reproduces)."""

    def __init__(self, module: cst.Module, text: str):
        self.module = module
        self.text = text
        self._parents: Optional[Dict[int, cst.CSTNode]] = None
        self._by_statement: Dict[int, Tuple[Mapping[cst.CSTNode, CodeRange], int]] = {}
        self._whole: Optional[Mapping[cst.CSTNode, CodeRange]] = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        chain = self._chain(node)
        while chain:  # the innermost statement, else the one around it (its code may be unique)
            located = self._by_statement.get(id(chain[-1]))
            if located is None:
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
            self._whole = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
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
        wrapper = MetadataWrapper(small, unsafe_skip_copy=True)
        resolved = wrapper.resolve_many([PositionProvider, WhitespaceInclusivePositionProvider])
        around = resolved[WhitespaceInclusivePositionProvider][statement]
        generated = small.code
        starts = [0] + [match.end() for match in _NEWLINE.finditer(generated)]  # of each line
        if around.start.column != 0 or around.end.column != 0 or around.end.line > len(starts):
            return {}, 0
        code = generated[starts[around.start.line - 1] : starts[around.end.line - 1]]
        at = self.text.find(code)
        if not code or at < 0 or self.text.find(code, at + 1) >= 0 or (at and self.text[at - 1] not in "\r\n"):
            return {}, 0
        line = 1 + len(_NEWLINE.findall(self.text, 0, at))
        return resolved[PositionProvider], line - around.start.line
