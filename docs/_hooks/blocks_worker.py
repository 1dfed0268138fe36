"""Runs a page's Python blocks in order, in one namespace (as a reader runs a guide and as
tests/test_docs.py runs them with Sybil), and reports what each printed.

Started by the `snippets` hook in a process of its own, so that one page's JAX settings
(`jax_enable_x64`) never leak into another page or into the docs build:

    python docs/_hooks/blocks_worker.py < blocks.json > outputs.json

stdin: a JSON list of code strings. stdout: a JSON list with one entry per block,
``{"stdout": "...", "error": null}``, or, for the first block that raised,
``{"stdout": "...", "error": "<traceback>"}`` and nothing after it.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def run(blocks: list[str]) -> list[dict[str, str | None]]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    results: list[dict[str, str | None]] = []
    for index, code in enumerate(blocks):
        out = io.StringIO()
        error = None
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"<block {index + 1}>", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - reported to the build, which fails
            error = traceback.format_exc()
        results.append({"stdout": out.getvalue(), "error": error})
        if error is not None:
            break
    return results


if __name__ == "__main__":
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # anything printed outside a block stays out of the JSON
    json.dump(run(json.load(sys.stdin)), real_stdout)
