"""What the docs hooks share: running Python at build time, a cache for its results, and
the Markdown that shows an output.

The docs show real output -- an error message, an example's printout, its plot --
captured by running the code when the site is built, so it cannot drift from the code.
Results are cached in ``build/docs-cache/`` (git-ignored), keyed by the code that ran and
by the contents of ``jaxbridge/``: ``mkdocs serve`` reruns only what changed, and CI,
which starts without the folder, runs everything. ``JAXBRIDGE_DOCS_CACHE=off`` in the
environment turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "docs-cache"
# An output line longer than this is cut: a JSON dump of 40 losses is not worth a screen
# (messages are single lines of a few hundred characters: they are shown whole)
LONGEST_LINE = 1000


class BuildError(PluginError):
    """Code the docs run at build time failed: the build stops and says where."""


def library_digest() -> str:
    """A digest of everything under jaxbridge/ that Python runs (a changed module makes
    every cached output stale)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "jaxbridge").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cached(key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`compute()`'s JSON-able result, from the cache when `key` (with the library's
    digest) ran before."""
    if os.environ.get("JAXBRIDGE_DOCS_CACHE", "").lower() in ("off", "0", "no"):
        return compute()
    name = hashlib.sha256((key + library_digest()).encode()).hexdigest()[:32]
    path = CACHE / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def shorten(text: str) -> str:
    """`text` with each very long line cut, saying how much was left out."""
    lines = []
    for line in text.rstrip().splitlines():
        if len(line) > LONGEST_LINE:
            line = f"{line[:LONGEST_LINE]} ... ({len(line) - LONGEST_LINE} more characters)"
        lines.append(line)
    return "\n".join(lines)


def output_block(text: str, title: str = "Output") -> str:
    """A Markdown code block that shows `text` as output: titled, styled as output
    (the `jb-output` class), and without a copy button (it is not code to run)."""
    text = shorten(text) or "(nothing printed)"
    longest_run = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest_run + 1)
    return (f'{fence} {{ .text .no-copy .jb-output title="{title}" }}\n'
            f"{text}\n{fence}")
