"""A mkdocs hook: a Python block marked ``<!-- output -->`` shows what it printed, run
when the site is built.

Write the marker on the line before a ```` ```python ```` block::

    <!-- output -->
    ```python
    try:
        f(jnp.ones(3, jnp.float32))
    except errors.ResultMismatchError as err:
        print(err)
    ```

The page's Python blocks run in order in one namespace (in a process of their own, see
`blocks_worker.py`), as tests/test_docs.py runs them with Sybil, and the marked block is
followed by an "Output" block holding what it printed. Blocks that Sybil skips
(``<!-- skip: next -->``, ``<!-- skip: start -->`` ... ``<!-- skip: end -->``) are not
run here either; a marked block may not be skipped. A block that raises stops the
build, naming the page and the block. Pages without a marker are not run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from outputs import BuildError, cached, output_block

MARKER = "<!-- output -->"
WORKER = Path(__file__).with_name("blocks_worker.py")
TIMEOUT_S = 600
_TOKENS = re.compile(
    r"^(?P<marker><!-- output -->)[ \t]*$"
    r"|^<!-- skip: (?P<skip>next|start|end)\b.*?-->[ \t]*$"
    r"|^```python[^\n]*\n(?P<code>.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL)


def python_blocks(markdown: str) -> list[tuple[re.Match[str], bool, bool]]:
    """Each ```python block of `markdown`: (its match, runs, is marked for output)."""
    blocks = []
    marked = skip_next = in_skip = False
    for token in _TOKENS.finditer(markdown):
        if token["marker"]:
            marked = True
        elif token["skip"] == "next":
            skip_next = True
        elif token["skip"] in ("start", "end"):
            in_skip = token["skip"] == "start"
        else:
            blocks.append((token, not (skip_next or in_skip), marked))
            marked = skip_next = False
    return blocks


def run_blocks(page: str, codes: list[str]) -> list[dict[str, Any]]:
    """What each block printed, from a fresh process in a scratch directory."""
    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="jaxbridge-docs-") as scratch:
            proc = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(codes),
                                  capture_output=True, text=True, cwd=scratch,
                                  timeout=TIMEOUT_S)
        if proc.returncode != 0:
            raise BuildError(f"{page}: running its Python blocks failed "
                             f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return {"results": json.loads(proc.stdout)}
    results = cached(f"snippets:{json.dumps(codes)}", compute)["results"]
    for index, result in enumerate(results):
        if result["error"] is not None:
            raise BuildError(f"{page}: Python block {index + 1} of those run raised:\n"
                             f"{result['error']}")
    return results


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    name = page.file.src_uri
    blocks = python_blocks(markdown)
    for match, runs, marked in blocks:
        if marked and not runs:
            line = markdown.count("\n", 0, match.start()) + 1
            raise BuildError(f"{name}:{line}: a block marked {MARKER} is skipped")
    running = [(match, marked) for match, runs, marked in blocks if runs]
    results = run_blocks(name, [match["code"] for match, _ in running])
    pieces, end = [], 0
    for (match, marked), result in zip(running, results):
        if marked:
            pieces += [markdown[end:match.end()], "\n\n", output_block(result["stdout"])]
            end = match.end()
    pieces.append(markdown[end:])
    return "".join(pieces).replace(MARKER + "\n", "")
