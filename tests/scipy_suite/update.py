"""Rerun SciPy's own tests against jaxbridge and rewrite failures.toml from what failed.

    python tests/scipy_suite/update.py            # the whole suite, pytest -n 2
    python tests/scipy_suite/update.py -k test_ivp -n 0   # extra arguments go to pytest
    python tests/scipy_suite/update.py --outcomes FILE    # reuse a --scipy-suite-record

A test that passes leaves the list, unless its reason is not strict (it fails on some
machines only: whether SciPy's own solve converges depends on the CPU). A test that
fails keeps its reason when that reason has no rules (given by hand) or its rules still
match the error; otherwise it gets the first reason whose rules match the error
("ErrorType: message"), or UNEXPLAINED, which
the default run's check (tests/test_scipy_suite_list.py) rejects until a reason, with a
line in the docs, is written for it. Tests the run did not reach (``-k``) keep their
entries. Prints the counts: collected, passed, skipped, failed per reason, wall time.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # run as a script: tests/ holds the package

from scipy_suite import explained  # noqa: E402


def run_suite(extra: list[str]) -> tuple[dict[str, dict[str, str]], float]:
    """{test id: {"outcome", "error"}} of one run of the suite, and its wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "outcomes.json"
        command = [sys.executable, "-m", "pytest", "-m", "scipy_suite", "-q", "-p",
                   "no:cacheprovider", f"--scipy-suite-record={record}"]
        command += extra if any(a.startswith("-n") for a in extra) else ["-n", "2", *extra]
        start = time.monotonic()
        subprocess.run(command, cwd=ROOT, check=False)
        took = time.monotonic() - start
        if not record.exists():
            sys.exit(f"update.py: pytest wrote no outcomes ({' '.join(command)})")
        return json.loads(record.read_text()), took


def refresh(listed: explained.Explained, outcomes: dict[str, dict[str, str]]) -> None:
    """Rewrite `listed.failures` from `outcomes` (the rules in the module docstring)."""
    failures = {test: key for test, key in listed.failures.items() if test not in outcomes
                or not listed.reasons.get(key, explained.STRICT).strict}
    for test, outcome in outcomes.items():
        if outcome["outcome"] != "failed":
            continue
        error = outcome.get("error", "")
        old = listed.reasons.get(listed.failures.get(test, ""))
        keep = old is not None and (not old.rules or old.matches(error))
        failures[test] = old.key if keep and old else listed.classify(error)
    listed.failures = failures


def main(extra: list[str]) -> int:
    listed = explained.load()
    if extra[:1] == ["--outcomes"]:
        outcomes, took = json.loads(Path(extra[1]).read_text()), float("nan")
    else:
        outcomes, took = run_suite(extra)
    refresh(listed, outcomes)
    explained.dump(listed)
    counts = collections.Counter(o["outcome"] for o in outcomes.values())
    by_reason = collections.Counter(listed.failures[t] for t, o in outcomes.items()
                                    if o["outcome"] == "failed")
    print(f"\nscipy_suite: {len(outcomes)} tests run in {took / 60:.1f} min: "
          f"{counts['passed']} passed, {counts['skipped']} skipped, "
          f"{counts['failed']} failed")
    for key, n in by_reason.most_common():
        print(f"  {n:5d}  {key}")
    unexplained = [t for t, k in listed.failures.items() if k == explained.UNEXPLAINED]
    for test in unexplained:
        print(f"UNEXPLAINED {test}: {outcomes.get(test, {}).get('error', '')[:200]}")
    print(f"wrote {explained.LIST.relative_to(ROOT)}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
