"""Glob matching in linear time, for the patterns a checkout can commit (.gitignore, ``exclude``,
``per-file-ignores``).

A glob translated to a backtracking regex (``[^/]*a[^/]*a...b``) can take time exponential in its
number of stars: ``*a*a*a*a*a*a*a*a*a*a*a*a*b`` against a 40-character name does not end in a minute.
Here a glob is a small automaton run on all its states at once, one bit a state in a Python int
(the bit-parallel simulation of Baeza-Yates and Navarro): each character of the name costs a few
integer operations whatever the pattern, so matching takes time linear in the name's length (times the
states' words). Several patterns run as one automaton, so an ignore file of thousands of patterns
costs one pass over the name too.

The language is the one preclint has always matched: ``**/`` is any number of leading directories,
``**`` anything, ``*`` and ``?`` anything but ``/``, ``[...]`` a class (``!`` or ``^`` first negates;
``a-z`` ranges); every other character stands for itself. A whole name must match.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

# what an atom's character set is
_ANY, _NOT_SLASH, _LITERAL, _CLASS = range(4)


class GlobError(ValueError):
    """A pattern that is no glob (a class range that runs backwards); ``msg`` says why."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg


@dataclass(frozen=True)
class _Chars:
    kind: int
    literal: str = ""
    ranges: Tuple[Tuple[str, str], ...] = ()
    negated: bool = False

    def __contains__(self, c: str) -> bool:
        if self.kind == _ANY:
            return True
        if self.kind == _NOT_SLASH:
            return c != "/"
        if self.kind == _LITERAL:
            return c == self.literal
        return any(low <= c <= high for low, high in self.ranges) != self.negated


@dataclass(frozen=True)
class _Atom:
    """One state of the automaton: it stays on a character of ``loop``, moves to the next state on one
    of ``advance``, and with ``skip`` the next state is active whenever it is (a star matches nothing).
    A state with all three (``**/``) skips only when it is entered, not after it stayed on a character:
    ``(?:.*/)?`` is nothing, or anything that ends with a ``/``."""

    loop: Optional[_Chars] = None
    advance: Optional[_Chars] = None
    skip: bool = False


_ANY_CHARS, _NOT_SLASH_CHARS = _Chars(_ANY), _Chars(_NOT_SLASH)


def _class(pattern: str, start: int) -> Optional[Tuple[_Chars, int]]:
    """The class that opens at ``pattern[start] == '['`` and the index after it; None when no ``]``
    closes it (the ``[`` is then a plain character)."""
    end = pattern.find("]", start + 1)
    if end < 0:
        return None
    body = pattern[start + 1:end]
    negated = body[:1] in ("!", "^")
    if negated:
        body = body[1:]
    ranges = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            low, high = body[i], body[i + 2]
            if low > high:
                raise GlobError(f"bad character range {low}-{high}")
            ranges.append((low, high))
            i += 3
        else:
            ranges.append((body[i], body[i]))
            i += 1
    return _Chars(_CLASS, ranges=tuple(ranges), negated=negated), end + 1


@functools.lru_cache(maxsize=4096)
def parse(pattern: str) -> Tuple[_Atom, ...]:
    """The automaton's states for ``pattern``; a GlobError for a pattern that is no glob."""
    atoms: List[_Atom] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):  # no directory, or any number of them
            atom, i = _Atom(loop=_ANY_CHARS, advance=_Chars(_LITERAL, "/"), skip=True), i + 3
        elif pattern.startswith("**", i):
            atom, i = _Atom(loop=_ANY_CHARS, skip=True), i + 2
        elif c == "*":
            atom, i = _Atom(loop=_NOT_SLASH_CHARS, skip=True), i + 1
        elif c == "?":
            atom, i = _Atom(advance=_NOT_SLASH_CHARS), i + 1
        elif c == "[" and _class(pattern, i) is not None:
            chars, i = _class(pattern, i)  # type: ignore[misc]
            atom = _Atom(advance=chars)
        else:
            atom, i = _Atom(advance=_Chars(_LITERAL, c)), i + 1
        if (atoms and atom.skip and not atom.advance and atoms[-1].skip and not atoms[-1].advance
                and atoms[-1].loop == atom.loop):
            continue  # `*` after `*`: one star (keeps runs of skipping states short)
        atoms.append(atom)
    return tuple(atoms)


def _mask(positions: Sequence[int]) -> int:
    """An int with the bits at ``positions`` set (built in one go: or-ing bit by bit into a wide int
    is quadratic)."""
    if not positions:
        return 0
    data = bytearray(max(positions) // 8 + 1)
    for p in positions:
        data[p >> 3] |= 1 << (p & 7)
    return int.from_bytes(bytes(data), "little")


class GlobSet:
    """Patterns matched together: ``matching(text)`` tells which of them match the whole of ``text``.
    A pattern that is no glob raises GlobError, or with ``skip_bad`` never matches."""

    def __init__(self, patterns: Sequence[str], skip_bad: bool = False):
        starts, accepts, skips, dirs = [], [], [], []
        loop_any, loop_not_slash, advance_any, advance_not_slash = [], [], [], []
        literal: Dict[str, List[int]] = {}
        self._classes: List[Tuple[int, _Atom]] = []  # (state, atom) of the atoms with a class
        self._owner: Dict[int, int] = {}  # accepting state -> index of its pattern
        state = 0
        for index, pattern in enumerate(patterns):
            try:
                atoms = parse(pattern)
            except GlobError:
                if not skip_bad:
                    raise
                continue
            starts.append(state)
            for atom in atoms:
                if atom.skip:
                    skips.append(state)
                    if atom.advance is not None:
                        dirs.append(state)
                for chars, on_any, on_not_slash in ((atom.loop, loop_any, loop_not_slash),
                                                     (atom.advance, advance_any, advance_not_slash)):
                    if chars is None:
                        continue
                    if chars.kind == _ANY:
                        on_any.append(state)
                    elif chars.kind == _NOT_SLASH:
                        on_not_slash.append(state)
                    elif chars.kind == _LITERAL:  # (only ever an advance)
                        literal.setdefault(chars.literal, []).append(state)
                    else:
                        self._classes.append((state, atom))
                state += 1
            accepts.append(state)
            self._owner[state] = index
            state += 1
        self._skip, self._dirs = _mask(skips), _mask(dirs)
        self._accept = _mask(accepts)
        self._start = self._closure(_mask(starts))
        self._loop_any, self._loop_not_slash = _mask(loop_any), _mask(loop_not_slash)
        self._advance_any, self._advance_not_slash = _mask(advance_any), _mask(advance_not_slash)
        self._literal = {c: _mask(states) for c, states in literal.items()}
        self._by_char: Dict[str, Tuple[int, int]] = {}

    def _closure(self, active: int) -> int:
        """``active`` with the states that skipping states make active: in a run of skipping states,
        every state from the lowest active one to the state after the run (one addition carries
        through the run)."""
        skip = self._skip
        return active | ((skip + (active & skip)) ^ skip)

    def _masks(self, c: str) -> Tuple[int, int]:
        """(the states that stay on ``c``, the states that move on ``c``)."""
        found = self._by_char.get(c)
        if found is None:
            loop, advance = self._loop_any, self._advance_any | self._literal.get(c, 0)
            if c != "/":
                loop |= self._loop_not_slash
                advance |= self._advance_not_slash
            class_loop, class_advance = [], []
            for state, atom in self._classes:
                if atom.loop is not None and c in atom.loop:
                    class_loop.append(state)
                if atom.advance is not None and c in atom.advance:
                    class_advance.append(state)
            found = (loop | _mask(class_loop), advance | _mask(class_advance))
            if len(self._by_char) < 4096:
                self._by_char[c] = found
        return found

    def _run(self, text: str, at_slash: bool = False) -> Iterator[int]:
        """The accepting states active after the whole of ``text`` (with ``at_slash``, also before each
        ``/``: the patterns that match a leading part of the path, a directory of it)."""
        active = self._start
        for c in text:
            if at_slash and c == "/":
                yield active & self._accept
            loop, advance = self._masks(c)
            stayed = active & loop
            in_dirs = stayed & self._dirs  # a `**/` that stayed on a character is not entered again
            active = self._closure((stayed ^ in_dirs) | ((active & advance) << 1)) | in_dirs
            if not active:
                return
        yield active & self._accept

    def _indices(self, accepted: int) -> List[int]:
        out = []
        while accepted:
            top = accepted.bit_length() - 1
            out.append(self._owner[top])
            accepted ^= 1 << top
        return sorted(out)

    def matching(self, text: str) -> List[int]:
        """The indices of the patterns that match the whole of ``text``, in order."""
        return self._indices(next(iter(self._run(text)), 0))

    def matching_leading(self, text: str) -> List[int]:
        """The indices of the patterns that match ``text`` or a part of it that ends before a ``/``."""
        accepted = 0
        for hits in self._run(text, at_slash=True):
            accepted |= hits
        return self._indices(accepted)


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> GlobSet:
    """One pattern as a GlobSet (cached); a GlobError for a pattern that is no glob."""
    return GlobSet([pattern])


def full_match(pattern: str, text: str) -> bool:
    """Whether the glob ``pattern`` matches the whole of ``text``."""
    return bool(compiled(pattern).matching(text))
