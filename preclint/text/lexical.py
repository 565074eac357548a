"""A lexical scan of Python text that cannot fail and takes time linear in the text's length.

The source side asks three lexical questions: where the comments are (suppression directives), how
many tokens the longest logical line has (how deep libcst could nest a file CPython cannot parse), and
how many string literals an implicitly concatenated string is made of. The ``tokenize`` module is no
fit for a linter that is handed arbitrary bytes: since Python 3.12 it wraps the C tokenizer, which
raises ``SystemError`` on a NUL byte and is far slower on long lines (a 1.5 MB generated file: 130 s
on 3.12, 1.3 s on 3.11), and it stops at the first error, where a broken file still has comments.

This scan is a handful of regular expressions with no nested quantifiers over the same characters,
one pass over the text. It knows what decides where comments and statements are: string literals
(prefixes, triple quotes, escapes, an unterminated literal running to the end of its line, or of the
text when triple-quoted), brackets and line continuations. It does not check syntax. Line breaks are
``\\r\\n``, ``\\r`` and ``\\n``, as CPython's and libcst's parsers count lines. One approximation: a
Python 3.12 f-string that reuses its own quote inside a replacement field (``f"{d["k"]}"``) is read
as two literals around the field, as Python < 3.12 would read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

COMMENT = "comment"
STRING = "string"
NEWLINE = "newline"  # the end of a logical line (a statement's line, brackets closed)
OTHER = "other"  # a name, a number or one operator character: an upper bound on CPython's tokens

# A string literal: a prefix, then a triple-quoted body that may run to the end of the text, or a
# one-line body that may stop at the end of its line (unterminated). Each loop alternates disjoint
# character classes, so a failed match has nothing to retry: linear time.
_STRING = r"""(?:[rRbBuUfFtT]{1,3})?
    (?: '''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*(?:'''|\Z)
      | \"\"\"[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*(?:\"\"\"|\Z)
      | '[^'\\\r\n]*(?:\\(?:\r\n|[\s\S])[^'\\\r\n]*)*'?
      | "[^"\\\r\n]*(?:\\(?:\r\n|[\s\S])[^"\\\r\n]*)*"?
    )"""
_COMMENT = r"\#[^\r\n]*"
_TOKEN = re.compile(
    r"""
    (?P<blank>[ \t\f]+|\\(?:\r\n|\r|\n|\Z))    # spaces, a line continuation
  | (?P<newline>\r\n|\r|\n)
  | (?P<comment>""" + _COMMENT + r""")
  | (?P<string>""" + _STRING + r""")
  | (?P<word>\w+)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<other>[\s\S])
    """,
    re.VERBOSE,
)
# what decides where comments are: outside a comment, a quote always starts a literal
_STRING_OR_COMMENT = re.compile(r"(?P<string>" + _STRING + r")|(?P<comment>" + _COMMENT + ")", re.VERBOSE)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Token:
    kind: str  # COMMENT, STRING, NEWLINE or OTHER
    line: int  # 1-based
    column: int  # 0-based, in characters
    text: str


def tokens(text: str) -> Iterator[Token]:
    """The comments, string literals, other tokens and logical line ends of ``text``, in order."""
    line = 1
    line_start = 0
    depth = 0  # open brackets: a line break inside them does not end the statement
    tokens_on_line = 0
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        start = match.start()
        if kind == "blank":
            if match.group().startswith("\\"):  # a continuation: the next line is the same statement
                line += 1
                line_start = match.end()
            continue
        if kind == "newline":
            if depth == 0 and tokens_on_line:
                yield Token(NEWLINE, line, start - line_start, match.group())
                tokens_on_line = 0
            line += 1
            line_start = match.end()
            continue
        if kind == "comment":
            yield Token(COMMENT, line, start - line_start, match.group())
            continue
        tokens_on_line += 1
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth = max(depth - 1, 0)
        value = match.group()
        yield Token(STRING if kind == "string" else OTHER, line, start - line_start, value)
        if kind == "string":
            breaks = list(_LINE_BREAK.finditer(value))
            if breaks:  # a triple-quoted literal over several lines
                line += len(breaks)
                line_start = start + breaks[-1].end()
    if tokens_on_line:
        yield Token(NEWLINE, line, len(text) - line_start, "")


def comments(text: str) -> Iterator[Token]:
    """The comments of ``text`` (``#`` outside string literals, to the end of the line): the same
    as ``tokens``' comments, found without stopping at every other token."""
    line = 1
    line_start = 0
    counted_to = 0  # line breaks before this offset are counted in ``line``
    for match in _STRING_OR_COMMENT.finditer(text):
        if match.lastgroup != "comment":
            continue
        start = match.start()
        for brk in _LINE_BREAK.finditer(text, counted_to, start):
            line += 1
            line_start = brk.end()
        counted_to = start
        yield Token(COMMENT, line, start - line_start, match.group())


def most_tokens_in_a_statement(text: str, enough: int = 0) -> int:
    """The most tokens of any logical line (each operator character counted as one: an upper bound);
    the scan stops once a line has more than ``enough`` (when given)."""
    most = current = 0
    for token in tokens(text):
        if token.kind == NEWLINE:
            most, current = max(most, current), 0
        elif token.kind != COMMENT:
            current += 1
            if enough and current > enough:
                break
    return max(most, current)


def string_literals(text: str) -> int:
    """How many string literals ``text`` holds (an implicitly concatenated string: one each)."""
    return sum(1 for token in tokens(text) if token.kind == STRING)
