"""A griffe extension for the API pages: docstrings speak to readers of the site.

* A repository path to a page of this site (``docs/guides/kernels.md``,
  ``examples/quickstart.py``) becomes a link to that page, titled by the page's heading
  ("Writing a kernel"). In a terminal, ``help()`` still shows the path.
* A module docstring longer than `LONG_MODULE_NOTES` lines keeps its first paragraph in
  view and folds the rest into a collapsed "How it works" block, so a module page opens
  on its functions, not on pages of design notes.

The docstrings themselves stay as they are.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
LONG_MODULE_NOTES = 15
# a docs page or an example script, bare or in ``code``; not part of a longer path
_PATH = re.compile(r"(?<![\w/.])(`{1,2})?(?P<path>(?:docs/[\w/-]+\.md|examples/\w+\.py))\1?"
                   r"(?![\w/])")


def page_title(path: str) -> str | None:
    """The heading a reader sees for the repository file `path`, or None if the site
    has no page for it. API pages live in docs/api/, hence the links' ``../``."""
    file = ROOT / path
    if not file.is_file():
        return None
    if path.startswith("examples/"):
        doc = ast.get_docstring(ast.parse(file.read_text())) or file.stem
        return doc.partition("\n")[0].rstrip(".")
    heading = re.search(r"^# (.+)$", file.read_text(), re.MULTILINE)
    return heading[1].strip("`") if heading else file.stem


def link_paths(doc: str) -> str:
    def link(match: re.Match[str]) -> str:
        path = match["path"]
        title = page_title(path)
        if title is None:
            return match[0]
        target = path.removeprefix("docs/") if path.startswith("docs/") else (
            path.replace(".py", ".md"))
        return f"[{title}](../{target})"
    return _PATH.sub(link, doc)


def fold_module_notes(doc: str) -> str:
    """A long module docstring: its first paragraph, then the rest collapsed."""
    if len(doc.splitlines()) <= LONG_MODULE_NOTES:
        return doc
    first, sep, rest = doc.partition("\n\n")
    if not sep:
        return doc
    body = "\n".join(f"    {line}" if line.strip() else "" for line in rest.splitlines())
    return f'{first}\n\n??? abstract "How it works"\n\n{body}\n'


class ReaderLinks(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = link_paths(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.is_alias:
                continue
            if obj.docstring is not None:
                value = link_paths(obj.docstring.value)
                if obj.is_module and "??? abstract" not in value:
                    value = fold_module_notes(value)
                obj.docstring.value = value
            stack.extend(obj.members.values())
