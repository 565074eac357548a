"""The one boundary between what users name (files, modules, classes, messages quoting them) and the
places preclint prints it: every output format converts its text here, for its sink.

Findings keep the raw names; each format calls the function for where its text goes:

- a terminal or a CI log (full, concise, github, stderr): :func:`visible` shows control characters,
  escape sequences, bidi overrides and other invisible format characters as ``\\x1b`` / ``\\u202e``,
  and :func:`log_lines` keeps any line from being read as a GitHub workflow command;
- a GitHub workflow command (``::warning ...::message``): :func:`annotation_data` and
  :func:`annotation_property`, escaped as @actions/core escapes them;
- rich: never markup built from user text; the console formats print ``rich.text.Text`` of
  :func:`visible` text;
- HTML: :func:`html_text`; chart labels, which plotly renders as a subset of HTML (``<a href>``,
  ``<b>``, ``<br>`` and entities), :func:`chart_label`;
- a unified diff's headers: :func:`diff_path`, quoted as git quotes a name;
- SARIF: :func:`file_uri`, an RFC 3986 URI reference; JSON documents (json, rdjson, gitlab):
  :func:`json_text`, valid JSON with the raw names;
- XML (junit): :func:`xml_text`, text that XML 1.0 can carry, that a CI page shows as it is and
  that a CI log does not read as a command; the markup (``&``, ``<``, quotes) is the XML writer's.
"""
from __future__ import annotations

import html
import json
import re
import unicodedata
from urllib.parse import quote

# Control characters (C0, DEL, C1), format characters (bidi overrides and isolates, zero-width
# characters, tag characters, the BOM), lone surrogates (a file name that is not UTF-8) and the
# Unicode line and paragraph separators: what a terminal or a viewer acts on or hides.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# GitHub's runner reads a line as a command when it starts with "::" after leading whitespace
# (ActionCommand.TryParseV2), or when "##[" occurs anywhere in it (the older ActionCommand.TryParse)
_COMMAND_START = re.compile(r"^(\s*):(?=:)")
_OLD_COMMAND = "##["


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as os.fsdecode keeps it: show the byte
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal would act on or that hides itself written out as an
    escape (``\\n``, ``\\x1b``, ``\\u202e``); the characters in ``keep`` stay as they are."""
    text = str(text)
    if text.isprintable():  # the common case: nothing to show
        return text
    return "".join(_shown(c) if c not in keep and unicodedata.category(c) in _HIDDEN_CATEGORIES else c for c in text)


def visible_text(text: str) -> str:
    """Several lines of user text (source lines, a diff): each line :func:`visible`, tabs kept, and the
    line endings (``\\n``, ``\\r\\n``) kept."""
    out = []
    for line in str(text).split("\n"):
        ending = "\r" if line.endswith("\r") else ""
        out.append(visible(line[: len(line) - len(ending)], keep="\t") + ending)
    return "\n".join(out)


def log_line(line: str) -> str:
    """One line of text output that no CI runner reads as a workflow command: a leading ``::`` and any
    ``##[`` are written with an escape (``\\x3a:``, ``##\\x5b``). For lines that are already
    :func:`visible` (they hold no line break)."""
    line = _COMMAND_START.sub(r"\1\\x3a", line, count=1)
    return line.replace(_OLD_COMMAND, "##\\x5b") if _OLD_COMMAND in line else line


def log_lines(text: str) -> str:
    """:func:`log_line` for every line of a text output that holds no workflow command of preclint's."""
    return "\n".join(log_line(line) for line in text.split("\n"))


def console_line(text: str) -> str:
    """A line for the terminal or a CI log (stderr's error and warning lines): visible, no command."""
    return log_line(visible(text))


_C_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
              "\f": "\\f", "\r": "\\r"}


def diff_path(label: str) -> str:
    """A file name in a diff header (``a/path``) as git writes one that needs quoting, which git apply
    and patch read back: in double quotes, with C escapes, the bytes of other hidden characters in
    octal. As it is when nothing needs quoting."""
    if label.isprintable() and '"' not in label and "\\" not in label:
        return label
    out = []
    for char in label:
        if char in _C_ESCAPES:
            out.append(_C_ESCAPES[char])
        elif unicodedata.category(char) in _HIDDEN_CATEGORIES:
            out.extend(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogateescape"))
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def annotation_data(text: str) -> str:
    """The message of a workflow command: ``%``, CR and LF escaped (the runner unescapes them), so
    nothing in it can end the command or start another."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotation_property(text: str) -> str:
    """A property value of a workflow command (``file=``, ``title=``): also ``:`` and ``,``, which
    would end the value or the properties."""
    return annotation_data(text).replace(":", "%3A").replace(",", "%2C")


def html_text(text: str) -> str:
    """Text in an HTML page: markup-escaped, invisible characters shown (tabs kept)."""
    return html.escape(visible(text, keep="\t"), quote=True)


def chart_label(text: str) -> str:
    """A label or hover text that plotly draws: it renders tags (``<a href>``, ``<b>``, ``<br>``) and
    the entities ``&lt; &gt; &amp;`` (and numeric ones) in them, but not ``&quot;``; so ``&``, ``<``
    and ``>`` are written as entities and quotes left as they are."""
    return visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def file_uri(path: str) -> str:
    """A relative path as an RFC 3986 URI reference: each segment percent-encoded (its UTF-8 bytes, or
    the original bytes of a name that is not UTF-8), the ``/`` between segments kept. A ``:`` is
    encoded too, so a first segment cannot read as a scheme."""
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(document, **options) -> str:
    """``json.dumps(document, ensure_ascii=False, **options)`` that can always be written as UTF-8: a
    lone surrogate (a file name that is not UTF-8) is written as its ``\\udcff`` escape, as
    ``ensure_ascii`` would write it, so the name stays the raw name."""
    text = json.dumps(document, ensure_ascii=False, **options)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# XML 1.0's Char production: what a document may hold at all, even as a character reference
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """User text for an XML document read by people on a CI page (Jenkins, GitLab, Azure): every
    character a viewer acts on or hides shown as its escape, as :func:`visible` does, and so every
    character XML 1.0 cannot carry (C0 controls, a lone surrogate, U+FFFE and U+FFFF), which no
    reference can write either and which makes a parser reject the whole report. Printed on stdout in
    a CI log, no line of it is a workflow command either (:func:`log_line`)."""
    text = visible(text)
    return log_line(_NOT_XML.sub(lambda m: _shown(m.group()), text) if _NOT_XML.search(text) else text)
