"""A griffe extension for the API pages: read two Google-style habits of jaxbridge's
docstrings as Napoleon (Sphinx) and the Google style guide read them.

* ``Example:`` (singular) is a section of doctest examples. griffe's Google parser
  knows only the plural ``Examples:`` and turns the singular into an admonition of
  plain Markdown, where ``>>>`` lines become nested block quotes.
* ``rtol, atol: ...`` in ``Args:`` documents several parameters at once. griffe reads
  it as one parameter named "rtol, atol" that is not in the signature; each name gets
  the shared description here.
* Sphinx roles (``:func:`root```, ``:class:`OptimizeResult```) are plain code
  here: Markdown has no roles, and the names are often relative to the module.

The docstrings stay as they are (doctest runs their examples in tests/test_docs.py).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|exc|data|obj):(`[^`]+`)")
_SINGULAR = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
# "  a, b, c: text" with the continuation lines indented deeper
_GROUP = re.compile(
    r"^(?P<indent>[ \t]+)(?P<names>\w+(?:, \w+)+): (?P<text>.*(?:\n(?P=indent)[ \t]+.*)*)",
    re.MULTILINE)


def _split_group(match: re.Match[str]) -> str:
    indent, text = match["indent"], match["text"]
    return "\n".join(f"{indent}{name}: {text}" for name in match["names"].split(", "))


def rewrite(doc: str) -> str:
    doc = _ROLE.sub(r"\1", _SINGULAR.sub(r"\1Examples:", doc))
    head, sep, rest = doc.partition("Args:\n")
    if not sep:
        return doc
    section, end, tail = _section(rest)
    return head + sep + _GROUP.sub(_split_group, section) + end + tail


def _section(rest: str) -> tuple[str, str, str]:
    """Split `rest` (what follows "Args:") at its first blank line."""
    match = re.search(r"\n[ \t]*\n", rest)
    if match is None:
        return rest, "", ""
    return rest[:match.start()], match.group(), rest[match.end():]


class ExampleSections(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # a package's own docstring (jaxbridge/__init__.py) does not pass through
        # on_object; walk the loaded tree once more (rewrite() is idempotent)
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.is_alias:
                continue
            self.on_object(obj=obj)
            stack.extend(obj.members.values())
