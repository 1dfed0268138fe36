"""A mkdocs hook: the copy button of a doctest block (``>>>`` prompts, as in the API
pages' examples) copies its code only -- no prompts, no printed output, no traceback.

Material's copy button copies the ``data-copy`` attribute of the block's element when
there is one, and the block's text otherwise. A doctest's text holds its prompts and its
expected output, which a reader pasting it into Python must then delete; this hook gives
each such block a ``data-copy`` with the lines after its prompts.
"""

from __future__ import annotations

import html
import re
from typing import Any

_BLOCK = re.compile(r'(<div class="[^"]*\bhighlight\b[^"]*")(>\s*(?:<span class="filename">'
                    r'.*?</span>)?<pre>)(.*?)(</pre>)', re.DOTALL)
_PROMPT = re.compile(r'^(?:<span></span>)?(?:<code>)?<span class="gp">(?:&gt;&gt;&gt;|\.\.\.)'
                     r' ?</span>(.*)$')
_TAG = re.compile(r"<[^>]+>")


def doctest_code(block: str) -> str | None:
    """The code of a highlighted doctest `block` (the HTML inside its <pre>), or None
    when it has no prompts."""
    if 'class="gp"' not in block:
        return None
    lines = [_PROMPT.match(line) for line in block.splitlines()]
    return "\n".join(html.unescape(_TAG.sub("", m[1])) for m in lines if m)


def with_copy_text(page: str) -> str:
    def block(match: re.Match[str]) -> str:
        code = doctest_code(match[3])
        if code is None:
            return match[0]
        copy = html.escape(code, quote=True).replace("\n", "&#10;")
        return f'{match[1]} data-copy="{copy}"{match[2]}{match[3]}{match[4]}'
    return _BLOCK.sub(block, page)


def on_page_content(html_text: str, **kwargs: Any) -> str:
    return with_copy_text(html_text)
