"""The explained-failures list (`failures.toml` beside this file): read, classify, write.

Layout of the file::

    [reasons.<key>]
    reason = "one line a user understands"
    docs = "docs/guides/scipy.md#<anchor>"   # the section that states the limitation
    words = "a phrase that section contains"
    functions = ["optimize.minimize"]   # the catalog rows it limits (each links the anchor)
    rules = [["TypeError", "regex over the error message"], ...]
    run = false    # optional: the listed tests are not run (a time limit, no verdict)
    strict = false # optional: the listed tests may pass (whether SciPy's own solve
                   # converges depends on the machine: OpenBLAS picks kernels by CPU)

    [failures]
    "scipy/optimize/tests/test_optimize.py::TestX::test_y[p]" = "<key>"

A failure whose key is `UNEXPLAINED` has no reason yet: the default run's check
(tests/test_scipy_suite_list.py) fails until someone gives it one.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

LIST = Path(__file__).with_name("failures.toml")
UNEXPLAINED = "UNEXPLAINED"


@dataclass(frozen=True)
class Reason:
    """One reason key: the line, the docs anchor and the error rules that assign it."""

    key: str
    reason: str
    docs: str
    words: str
    functions: tuple[str, ...] = ()
    rules: tuple[tuple[str, str], ...] = ()
    run: bool = True
    strict: bool = True

    def matches(self, error: str) -> bool:
        """Whether `error` ("ErrorType: message") is one this reason explains."""
        kind, _, message = error.partition(": ")
        return any(kind == rule_kind and re.search(pattern, message, re.S)
                   for rule_kind, pattern in self.rules)


STRICT = Reason("", "", "", "")  # what an unknown reason key counts as


@dataclass
class Explained:
    """The reasons and the failing tests (test id -> reason key)."""

    reasons: dict[str, Reason] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def classify(self, error: str) -> str:
        """The first reason (file order) whose rules match `error`, else UNEXPLAINED."""
        for reason in self.reasons.values():
            if reason.matches(error):
                return reason.key
        return UNEXPLAINED


def load(path: Path = LIST) -> Explained:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    reasons = {key: Reason(key, r["reason"], r["docs"], r["words"],
                           tuple(r.get("functions", ())),
                           tuple(tuple(rule) for rule in r.get("rules", ())),
                           r.get("run", True), r.get("strict", True))
               for key, r in data.get("reasons", {}).items()}
    return Explained(reasons, dict(data.get("failures", {})))


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


HEADER = """\
# SciPy's own tests run against jaxbridge's drop-ins (`pytest -m scipy_suite -n 2`):
# every test that fails, with the reason. Rewritten by `python tests/scipy_suite/update.py`
# (which keeps the reasons and their rules, and assigns reasons to new failures by the
# rules); a reason's `docs` anchor must contain its `words` (tests/test_scipy_suite_list.py).
# A listed test runs as xfail(strict=True): once it passes, remove its line (a reason
# with `strict = false` may pass on some machines: its tests stay listed when they do).
"""


def dump(explained: Explained, path: Path = LIST) -> None:
    lines = [HEADER]
    for r in explained.reasons.values():
        rules = ", ".join(f"[{_string(k)}, {_string(p)}]" for k, p in r.rules)
        lines += [f"[reasons.{r.key}]", f"reason = {_string(r.reason)}",
                  f"docs = {_string(r.docs)}", f"words = {_string(r.words)}",
                  f"functions = [{', '.join(map(_string, r.functions))}]",
                  f"rules = [{rules}]", *([] if r.run else ["run = false"]),
                  *([] if r.strict else ["strict = false"]), ""]
    lines.append("[failures]")
    lines += [f"{_string(test)} = {_string(key)}"
              for test, key in sorted(explained.failures.items())]
    path.write_text("\n".join(lines) + "\n")
