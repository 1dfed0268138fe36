"""The benchmark scripts' results files: what one run measured, and where and when.

Each script keeps printing its tables as it always has; given ``--json`` it also
writes one file per table into benchmarks/results/ (or the folder given), which
`benchmarks/plots.py` turns into docs/performance.md, benchmarks/RESULTS.md and the
plots. A file holds the table (``title``, ``unit``, ``columns``, ``rows``, ``legend``)
and its provenance, found by this module when the file is written: ``script``,
``command``, ``date`` (UTC), ``commit`` (``git describe``-style: the short hash, with
``+changes`` when tracked files differ from it), ``machine``, ``versions`` and
``conditions`` (the script's method, then the load average before and after).

    from record import Table, add_json_option
    add_json_option(parser)                      # --json [DIR]
    table = Table("hostcall", "x + 1 per call ...", "us per call, best / median",
                  ["dtype", "elements", ...], method="7 interleaved rounds ...")
    table.add(["float32", 1, ...])
    table.save(args.json)                        # nothing when --json was not given
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Versions every results file records; a script adds the peers it measured.
BASE_PACKAGES = ("jaxbridge", "jax", "jaxlib", "numpy", "scipy")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", nargs="?", const=str(RESULTS), default=None, metavar="DIR",
                        help="also write each table as DIR/NAME.json (default DIR: "
                             "benchmarks/results), the input of benchmarks/plots.py")


def commit() -> str:
    """The checked-out commit, "+changes" when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short=7", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def machine() -> str:
    """CPU model, cores, memory and the GPU JAX sees, in one line."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    described = f"{platform.machine()} {model}, {os.cpu_count()} cores{memory}"
    try:
        import jax
        device = jax.devices()[0]
        if device.platform != "cpu":
            described += f"; {device.device_kind}"
    except Exception:  # noqa: BLE001 - a description, never a failure
        pass
    return described


def versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in (*BASE_PACKAGES, *extra):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


class Table:
    """One table of one run: rows added as they are measured, saved as JSON."""

    def __init__(self, name: str, title: str, unit: str, columns: list[str], *,
                 method: str, legend: dict[str, str] | None = None,
                 packages: tuple[str, ...] = ()):
        self.name, self.title, self.unit, self.columns = name, title, unit, list(columns)
        self.method, self.legend, self.packages = method, legend or {}, packages
        self.rows: list[list[Any]] = []
        self.load_before = load_average()

    def add(self, row: list[Any]) -> None:
        if len(row) != len(self.columns):
            raise ValueError(f"{self.name}: a row of {len(row)} cells for "
                             f"{len(self.columns)} columns: {row}")
        self.rows.append([cell.strip() if isinstance(cell, str) else cell for cell in row])

    def as_dict(self) -> dict[str, Any]:
        script = Path(sys.argv[0]).resolve()
        try:
            script_name = script.relative_to(ROOT).as_posix()
        except ValueError:
            script_name = script.name
        args = " ".join(a for a in sys.argv[1:])
        return {
            "title": self.title, "unit": self.unit,
            "script": script_name, "command": f"python {script_name} {args}".strip(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "commit": commit(), "machine": machine(),
            "versions": versions(self.packages),
            "conditions": (f"{self.method}; load average (1/5/15 min) "
                           f"{self.load_before} before, {load_average()} after"),
            "provenance": f"written by {script_name} --json",
            "columns": self.columns, "rows": self.rows, "legend": self.legend,
        }

    def save(self, folder: str | None) -> None:
        """Write `folder`/NAME.json (nothing when `folder` is None: --json not given)."""
        if folder is None or not self.rows:
            return
        path = Path(folder) / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=1) + "\n")
        print(f"wrote {path}", flush=True)
