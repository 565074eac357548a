"""A rendered page's own prefix: every id, style rule and script of one HTML report is scoped to it, so
that two reports in one document (two outputs of a Jupyter notebook, a page that embeds both) never
address each other's elements, and the report's styles never reach the page around it.

A page is written with a random placeholder where the prefix goes, and the prefix is then derived from
the page's content: the same report renders to the same bytes (the command line's file and the API's
``_repr_html_`` agree), and two different reports get different prefixes. A report shown twice in one
document holds the same ids twice; its script draws into the first root of that id that no script has
drawn yet (``data-drawn``), so each copy still gets its own charts, once.
"""
from __future__ import annotations

import hashlib
import secrets

PREFIX_LENGTH = 12  # hex digits of the content's SHA-256: a collision of two reports in one notebook is 1 in 2**48


def placeholder() -> str:
    """A token to write where the prefix goes until the page is complete. Random, so no text of the
    report (a module name, a message) can hold it; it never reaches the output."""
    return "preclint-" + secrets.token_hex(16)


def prefix_of(parts, token: str) -> str:
    """The prefix of a page made of ``parts`` (strings holding ``token`` where the prefix goes)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.replace(token, "").encode("utf-8"))
    return "preclint-" + digest.hexdigest()[:PREFIX_LENGTH]


def scoped_css(css: str, root: str) -> str:
    """Each rule of ``css`` (plain rules, no at-rules) limited to the element with id ``root`` and what
    it holds; ``body`` becomes the root itself."""
    rules = []
    for rule in css.split("}"):
        if not rule.strip():
            continue
        selectors, declarations = rule.split("{", 1)
        scoped = [f"#{root}" if s.strip() == "body" else f"#{root} {s.strip()}" for s in selectors.split(",")]
        rules.append(",".join(scoped) + "{" + declarations.strip() + "}")
    return "\n".join(rules)
