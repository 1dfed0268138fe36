"""The numbers and plots of docs/performance.md, from the benchmarks' own results.

Each file in benchmarks/results/*.json is the output of one benchmark script: what it
measured (`columns`, `rows`, `unit`), and where and when (`script`, `command`, `date`,
`machine`, `versions`, `conditions`, `provenance`). This script renders

* one Markdown table per file into docs/performance.md, between the markers
  ``<!-- results: NAME -->`` and ``<!-- end results: NAME -->`` (so the page never holds
  a number typed by hand), and
* the PNG plots in docs/assets/performance/ for the files that `PLOTTERS` names (the
  others are shown as tables only; needs matplotlib: ``pip install ".[docs]"``).

    python benchmarks/plots.py            # rewrite the tables and the plots
    python benchmarks/plots.py --check    # exit 1 if the page's tables are out of date

After rerunning a benchmark, replace its results file (see its `provenance`), then run
this script and commit the three together.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
PLOTS = ROOT / "docs" / "assets" / "performance"


def load() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


# ------------------------------------------------------------------------------ tables
def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(result: dict[str, Any]) -> str:
    """The Markdown block for one results file: provenance line, then the table."""
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    lines = [f"*{result['title']}* ({result['unit']}). `{result['command']}`, "
             f"{result['date']}; {result['machine']}; {versions}; {result['conditions']}."]
    if result.get("legend"):
        lines.append("Columns: " + "; ".join(f"{k}: {v}" for k, v in result["legend"].items())
                     + ".")
    lines += ["",
             "| " + " | ".join(result["columns"]) + " |",
             "|" + "---|" * len(result["columns"])]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in result["rows"]]
    return "\n".join(lines)


def render_page(text: str, results: dict[str, dict[str, Any]]) -> str:
    """`text` with every results block replaced by the table rendered from its file."""
    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in results:
            raise SystemExit(f"{PAGE}: no benchmarks/results/{name}.json for its block")
        return f"<!-- results: {name} -->\n{table(results[name])}\n<!-- end results: {name} -->"
    return re.sub(r"<!-- results: (\w+) -->\n.*?<!-- end results: \1 -->", block, text,
                  flags=re.DOTALL)


# ------------------------------------------------------------------------------- plots
def _save(fig: Any, out: Path, plt: Any) -> None:
    # no matplotlib version in the file: the PNG changes only when the numbers do
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _best(cell: str) -> float | None:
    """The best of a "best / median" cell; None for "-" (no such mode)."""
    return None if cell == "-" else float(cell.split(" / ")[0])


def plot_hostcall(result: dict[str, Any], plt: Any, out: Path) -> None:
    cols = result["columns"]
    mechanisms = ["ours", "buffer_cb", "JAXbind", "pure_cb"]
    dtypes = sorted({r[0] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(10, 4.2), sharey=True)
    for ax, dtype in zip(axes, dtypes):
        rows = [r for r in result["rows"] if r[0] == dtype and r[2] == "returns"]
        for name in mechanisms:
            j = cols.index(name)
            points = [(int(r[1]), _best(r[j])) for r in rows if _best(r[j]) is not None]
            ax.plot(*zip(*points), marker="o", lw=2.5 if name == "ours" else 1.5,
                    label="jaxbridge" if name == "ours" else name)
        ax.set(xscale="log", yscale="log", xlabel=f"elements ({dtype})", title=dtype)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per call, best of 7 rounds")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Host call returning a new array, cost against size ({result['date']}, "
                 "shared cores)")
    fig.tight_layout()
    _save(fig, out, plt)


def _whole_decades(ax: Any) -> None:
    """Log axes from a power of ten to a power of ten: labelled ticks on narrow ranges."""
    import math
    for get, put in ((ax.get_xlim, ax.set_xlim), (ax.get_ylim, ax.set_ylim)):
        low, high = get()
        put(10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high)))
    ax.xaxis.set_minor_formatter("")
    ax.yaxis.set_minor_formatter("")


def plot_ode(result: dict[str, Any], plt: Any, out: Path) -> None:
    problems = ["Lotka-Volterra", "Robertson"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, problem in zip(axes, problems):
        for problem_, solver, cell, err, *_ in result["rows"]:
            try:
                ms, error = float(cell), float(err)
            except ValueError:  # "-" or "wrong (...)": nothing to plot
                continue
            if problem_ != problem:
                continue
            ours = solver.startswith("jaxbridge")
            ax.scatter(ms, error, marker="o" if ours else "s",
                       color="tab:blue" if ours else "tab:orange", s=30)
            ax.annotate(solver.replace("jaxbridge solve_ivp ", "").replace("stepping=", "")
                        .replace("diffrax ", "").replace(" rtol=1e-8", ""),
                        (ms, error), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="value + gradient (ms)",
               ylabel="gradient relative error", title=problem)
        _whole_decades(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].scatter([], [], marker="o", color="tab:blue", label="jaxbridge solve_ivp")
    axes[0].scatter([], [], marker="s", color="tab:orange", label="diffrax")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ODE gradients: cost against accuracy ({result['date']}, shared cores)")
    fig.tight_layout()
    _save(fig, out, plt)


def plot_kernels(result: dict[str, Any], plt: Any, out: Path) -> None:
    dtypes = sorted({r[0] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(11, 7.5), sharey=True)
    for ax, dtype in zip(axes, dtypes):
        rows = [r for r in result["rows"] if r[0] == dtype]
        labels = [f"{r[1]} {r[2]}" for r in rows]
        ratios = [r[3] / r[4] for r in rows]
        ax.barh(range(len(rows)), ratios,
                color=["tab:green" if q <= 1 else "tab:red" for q in ratios])
        ax.axvline(1.0, color="k", lw=1)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set(xscale="log", xlabel="time: jaxbridge / best jnp-lax (< 1: faster)", title=dtype,
               xlim=(0.1, 2.0))
        ax.set_xticks([0.1, 0.2, 0.5, 1.0, 2.0], ["0.1", "0.2", "0.5", "1", "2"])
        ax.minorticks_off()
        ax.grid(True, axis="x", which="both", alpha=0.3)
    axes[0].invert_yaxis()  # the axes share y: once, for the table's order top to bottom
    fig.suptitle(f"Built-in kernels against XLA ({result['date']})")
    fig.tight_layout()
    _save(fig, out, plt)


def plot_scaling(result: dict[str, Any], plt: Any, out: Path) -> None:
    rows = result["rows"]
    devices = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(devices, [r[2] for r in rows], marker="o", label="with a jaxbridge SciPy layer")
    ax.plot(devices, [r[3] for r in rows], marker="s", label="the same model in jnp")
    ax.set(xscale="log", xlabel="CPU devices (2 physical cores)", ylabel="examples / s",
           title=f"Data-parallel step ({result['date']}, shared cores)")
    ax.set_xticks(devices, [str(d) for d in devices])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out, plt)


PLOTTERS = {"hostcall": plot_hostcall, "scipy_solvers": plot_ode, "kernels": plot_kernels,
            "scaling": plot_scaling}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that docs/performance.md's tables are up to date")
    args = parser.parse_args(argv)
    results = load()
    text = PAGE.read_text()
    rendered = render_page(text, results)
    if args.check:
        if rendered != text:
            print(f"{PAGE} is out of date: run python benchmarks/plots.py")
            return 1
        print(f"{PAGE}: tables match benchmarks/results/")
        return 0
    PAGE.write_text(rendered)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    PLOTS.mkdir(parents=True, exist_ok=True)
    for name, plot in PLOTTERS.items():
        path = PLOTS / f"{name}.png"
        plot(results[name], plt, path)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
