"""A mkdocs hook: code in table cells and page titles may break after a dot, a comma, a
slash, ``::`` or an opening parenthesis, never inside a name -- except a sentence-long
snake_case name (a test's), which may also break after its underscores.

The site's CSS keeps identifiers in table cells whole (Material lets them break
anywhere, "integrate.sol ve_ivp"); a long dotted name such as
``jaxbridge.scipy.sparse.linalg.spsolve`` then gets a ``<wbr>`` after each dot, so a
narrow column can still wrap it between its parts; so does an API page's title
(``jaxbridge.scipy.integrate`` on a phone). A test named in a table
(``tests/test_delivery.py::test_declared_empty_result_runs_the_function_under_jit_too``)
is wider than any column: it may break after ``::`` and between the words of its name.
"""

from __future__ import annotations

import re
from typing import Any

_CELL = re.compile(r"<(td|th|h1)\b[^>]*>.*?</\1>", re.DOTALL)
_CODE = re.compile(r"(<code>)(.*?)(</code>)", re.DOTALL)
_TAG = re.compile(r"(<[^>]*>)")
# after a dot before a name (not inside a number like 1.5), or after , / ( ::
_BREAK_AFTER = re.compile(r"(\.(?=[A-Za-z_])|[,/(](?=[^\s<])|::(?=\w))")
# a name this long is a sentence (a test's name): it may break between its words
LONG_NAME = 30
_LONG_NAME = re.compile(rf"\w{{{LONG_NAME + 1},}}")


def _breaks(text: str) -> str:
    text = _LONG_NAME.sub(lambda name: re.sub(r"_(?=[^_])", "_<wbr>", name[0]), text)
    return _BREAK_AFTER.sub(r"\1<wbr>", text)


def soft_breaks(html: str) -> str:
    """`html` with a <wbr> after each break point inside code in table cells and
    titles."""
    def code(match: re.Match[str]) -> str:
        pieces = _TAG.split(match[2])  # text at even indices, tags (left alone) at odd ones
        text = "".join(p if i % 2 else _breaks(p) for i, p in enumerate(pieces))
        return match[1] + text + match[3]
    return _CELL.sub(lambda cell: _CODE.sub(code, cell[0]), html)


def on_page_content(html: str, **kwargs: Any) -> str:
    return soft_breaks(html)
