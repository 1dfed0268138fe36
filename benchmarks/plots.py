"""docs/performance.md, benchmarks/RESULTS.md and the plots, from the benchmarks' own results.

Each file in benchmarks/results/*.json is one table of one run of a benchmark script,
written by the script itself (``--json``, see benchmarks/record.py): what it measured
(``title``, ``unit``, ``columns``, ``rows``, ``legend``) and where and when (``script``,
``command``, ``date``, ``commit``, ``machine``, ``versions``, ``conditions``). This
script renders, between markers, so that no figure is ever typed by hand:

* ``<!-- goals -->`` in both files: one row per goal, our figure against the peer's,
  the ratio, and the date and commit of the run (`GOALS`);
* ``<!-- results: NAME -->`` in docs/performance.md: the table as the page shows it
  (`VIEWS`: the columns and rows a reader needs) and, collapsed, how it was measured;
* ``<!-- record: NAME -->`` in benchmarks/RESULTS.md: the whole table and its
  provenance;
* the PNG plots in docs/assets/performance/ (`PLOTS`; needs matplotlib).

    python benchmarks/plots.py            # rewrite the blocks and the plots
    python benchmarks/plots.py --check    # exit 1 if a block is out of date

To refresh every figure at one commit: run each script with ``--json`` (the list is in
benchmarks/RESULTS.md, "Rerunning"), then this script, and commit the three together.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
RECORD = ROOT / "benchmarks" / "RESULTS.md"
PLOT_DIR = ROOT / "docs" / "assets" / "performance"
Result = dict[str, Any]


def load() -> dict[str, Result]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


# ------------------------------------------------------------------------------ cells
def number(cell: Any) -> float | None:
    """The first number in a cell: "1.17 / 1.20" -> 1.17 (the best of best / median),
    "0.5 / 0.7" -> 0.5 (the first run), 5.45 -> 5.45; None for "-" or text."""
    if isinstance(cell, int | float):
        return float(cell)
    found = re.search(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", str(cell).replace(",", ""))
    return float(found[0]) if found else None


def matches(value: Any, wanted: str) -> bool:
    """`wanted` is the cell's text, or its beginning when it ends with "*"."""
    text = str(value)
    return text.startswith(wanted[:-1]) if wanted.endswith("*") else text == wanted


def find(result: Result, column: str, **where: str) -> str | None:
    """The first number in `column` of the one row whose cells match `where` (column
    names with spaces written as underscores), as written there; None when no row
    matches or the cell holds no number."""
    columns = result["columns"]
    for row in result["rows"]:
        cells = dict(zip(columns, row))
        if all(matches(cells.get(key.replace("_", " "), cells.get(key)), wanted)
               for key, wanted in where.items()):
            found = re.search(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", str(cells[column]))
            return found[0] if found else None
    return None


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def markdown_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows])


# ------------------------------------------------------------------------------ goals
@dataclass(frozen=True)
class Figure:
    """A figure of one results file: `label` for a reader, and how to find it."""

    label: str
    column: str
    where: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Goal:
    """Ours against the best (fastest) of `peers`, in one results file. `at_least` is
    the speedup the goal asks for: peer time / our time (0.25: within 4x of the peer)."""

    case: str
    goal: str
    results: str
    ours: Figure
    peers: tuple[Figure, ...]
    at_least: float
    unit: str


def _host(elements: str, mode: str = "returns") -> dict[str, str]:
    return {"dtype": "float32", "elements": elements, "mode": mode}


def _solver(problem: str, solver: str) -> dict[str, str]:
    return {"problem": problem, "solver": solver}


MS, US = "ms", "µs"
GOALS = [
    Goal("Host call, 1 element", "≥ 1.3x faster than buffer_callback and JAXbind",
         "hostcall", Figure("ours", "ours", _host("1")),
         (Figure("buffer_callback", "buffer_cb", _host("1")),
          Figure("JAXbind", "JAXbind", _host("1"))), 1.3, US),
    Goal("Host call, 1 element", "≥ 50x faster than pure_callback", "hostcall",
         Figure("ours", "ours", _host("1")), (Figure("pure_callback", "pure_cb", _host("1")),),
         50.0, US),
    Goal("Host call, 1,000 elements", "≥ 1.3x faster than buffer_callback and JAXbind",
         "hostcall", Figure("ours", "ours", _host("1000")),
         (Figure("buffer_callback", "buffer_cb", _host("1000")),
          Figure("JAXbind", "JAXbind", _host("1000"))), 1.3, US),
    Goal("Host call, 1M elements in place", "no slower than buffer_callback (aliased)",
         "hostcall", Figure("ours", "ours", _host("1000000", "in place")),
         (Figure("buffer_callback", "buffer_cb", _host("1000000", "in place")),), 1.0, US),
    Goal("grad through 200 host calls", "≥ 1.2x faster than JAXbind", "hostcall_grad",
         Figure("ours", "us per call", {"mechanism": "ours"}),
         (Figure("JAXbind", "us per call", {"mechanism": "JAXbind"}),), 1.2, US),
    Goal("ODE gradient, Lotka-Volterra, RK45", "within 4x of diffrax Tsit5", "lotka",
         Figure("ours", "value+grad (ms)",
                _solver("Lotka-Volterra", "jaxbridge solve_ivp RK45 stepping=compiled*")),
         (Figure("diffrax Tsit5", "value+grad (ms)",
                 _solver("Lotka-Volterra", "diffrax Tsit5 checkpoint adjoint*")),), 0.25, MS),
    Goal("Stiff ODE gradient, Robertson, LSODA", "no slower than diffrax Kvaerno5",
         "robertson", Figure("ours", "value+grad (ms)",
                             _solver("Robertson", "jaxbridge solve_ivp LSODA adjoint rtol=1e-08")),
         (Figure("diffrax Kvaerno5", "value+grad (ms)",
                 _solver("Robertson", "diffrax Kvaerno5 rtol=1e-08")),), 1.0, MS),
    *(Goal(f"Neural ODE gradient, P = {p}", "within 1.5x of diffrax Tsit5", "neural_ode",
           Figure("ours", "value+grad (ms)", _solver(f"Neural ODE P={p.replace(',', '')}",
                                                     "jaxbridge RK45*")),
           (Figure("diffrax Tsit5", "value+grad (ms)",
                   _solver(f"Neural ODE P={p.replace(',', '')}", "diffrax Tsit5*")),), 1 / 1.5, MS)
      for p in ("292", "2,788", "30,604")),
    *(Goal(f"Stiff neural ODE gradient, P = {p}", "no slower than diffrax Kvaerno5",
           "stiff_mlp", Figure("ours", "value+grad (ms)",
                               _solver(f"stiff MLP P={p.replace(',', '')}", "jaxbridge LSODA*")),
           (Figure("diffrax Kvaerno5", "value+grad (ms)",
                   _solver(f"stiff MLP P={p.replace(',', '')}", "diffrax Kvaerno5*")),), 1.0, MS)
      for p in ("292", "2,532")),
    *(Goal(f"DEQ layer, {size.replace('x', ' x ')}", "within 2x of optimistix", "deq",
           Figure("ours", "value+grad (ms)",
                  _solver(f"DEQ {size}", "jaxbridge root df-sane compiled (default) tol=1e-12,*")),
           (Figure("optimistix", "value+grad (ms)",
                   _solver(f"DEQ {size}", "optimistix fixed_point FixedPointIteration, "
                                          "ImplicitAdjoint(GMRES)*")),),
           0.5, MS)
      for size in ("16x32", "64x256")),
    Goal("PyTorch function, 1 element", "≥ 10x faster than a pure_callback bridge",
         "torch_bridge", Figure("ours", "1 element", {"mechanism": "jaxbridge.torch"}),
         (Figure("pure_callback", "1 element", {"mechanism": "pure_callback"}),), 10.0, US),
    Goal("PyTorch function, 1 element", "faster than torch2jax", "torch_bridge",
         Figure("ours", "1 element", {"mechanism": "jaxbridge.torch"}),
         (Figure("torch2jax", "1 element", {"mechanism": "torch2jax"}),), 1.0, US),
    Goal("PyTorch function, 1M elements", "within 1.25x of the NumPy host call",
         "torch_bridge", Figure("ours", "1M elements", {"mechanism": "jaxbridge.torch"}),
         (Figure("NumPy", "1M elements", {"mechanism": "numpy jb.foreign"}),),
         1 / 1.25, US),
    *(Goal(f"{case} inside a host call, idle", f"within {limit}x of {outside}", "threads",
           Figure("ours", "auto", {"case": f"{case}*", "load": "idle"}),
           (Figure(outside, "outside", {"case": f"{case}*", "load": "idle"}),), 1 / limit, MS)
      for case, limit, outside in (
          ("NumPy 1500² matmul", 1.1, "the same outside"),
          ("torch 1500² matmul", 1.1, "the same outside"),
          ("MLP 64-256-256-10 fwd + bwd", 1.2, "eager torch"),
          ("torch.sin 1M", 1.25, "np.sin in jb.foreign"))),
    *(Goal(f"{case} inside a host call, one core busy", "no slower than one thread "
           "(the cap before the budgets)", "threads",
           Figure("ours", "auto", {"case": f"{case}*", "load": "one core busy"}),
           (Figure("one thread", "one thread", {"case": f"{case}*", "load": "one core busy"}),),
           1.0, MS)
      for case in ("NumPy 1500² matmul", "torch 1500² matmul", "MLP 64-256-256-10 fwd + bwd",
                   "grad of tanh(A @ x)")),
    Goal("4 per-shard 1500² matmuls at once", "within 1.1x of the four in a row outside",
         "threads", Figure("ours", "auto", {"case": "4 per-shard*"}),
         (Figure("outside", "outside", {"case": "4 per-shard*"}),), 1 / 1.1, MS),
    *(Goal(f"Repeat eager call, {case}", "within 2x SciPy + 100 µs", "scipy_eager",
           Figure("ours", "jaxbridge", {"case": case}),
           (Figure("2x SciPy + 100 µs", "goal (2x SciPy + 100 us)", {"case": case}),), 1.0, US)
      for case in ("solve_ivp RK45 t_eval", "solve_ivp RK45 dense_output",
                   "solve_ivp RK45 events", "lfilter n=1,000", "root hybr n=2",
                   "quad exp(-x^2) [0, 3]")),
]


def goal_row(goal: Goal, results: dict[str, Result]) -> list[str]:
    result = results.get(goal.results)
    ours = None if result is None else find(result, goal.ours.column, **goal.ours.where)
    peers = [] if result is None else [
        (find(result, p.column, **p.where), p.label) for p in goal.peers]
    peers = [(number(value), value, label) for value, label in peers if value is not None]
    if ours is None or not peers or result is None:
        return [goal.case, goal.goal, "not measured", "-", "-", "-", "-"]
    peer, shown_peer, label = min(peers)  # the fastest peer
    speedup = peer / (number(ours) or float("nan"))
    ratio = f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"
    return [goal.case, goal.goal, f"{ours} {goal.unit}", f"{shown_peer} {goal.unit} ({label})",
            ratio, "yes" if speedup >= goal.at_least else "**no**",
            f"{result['date']} `{result['commit']}`"]


def goals_table(results: dict[str, Result]) -> str:
    rows = [goal_row(goal, results) for goal in GOALS]
    return "\n".join(markdown_table(
        ["case", "goal", "ours", "fastest peer", "ours against it", "met", "run"], rows))


# ------------------------------------------------------------------------------ views
Row = dict[str, Any]


@dataclass(frozen=True)
class View:
    """What the page shows of a results file: some columns, and the rows `pick` keeps."""

    columns: tuple[str, ...] = ()
    pick: Callable[[list[Row]], list[Row]] = lambda rows: rows


def largest_float32_size(rows: list[Row]) -> list[Row]:
    """Each kernel's (and derivative's) float32 row at the largest size measured (the
    script measures sizes in increasing order)."""
    last: dict[str, Row] = {}
    for row in rows:
        if row["dtype"] == "float32":
            last[row["kernel"]] = row
    return list(last.values())


def without(*words: str) -> Callable[[list[Row]], list[Row]]:
    return lambda rows: [r for r in rows if not any(w in r["solver"] for w in words)]


VIEWS = {
    "hostcall": View(("dtype", "elements", "mode", "ours", "buffer_cb", "JAXbind", "pure_cb")),
    "kernels": View(pick=largest_float32_size),
    "deq": View(("problem", "solver", "value+grad (ms)", "gradient error"),
                pick=without("SciPy's loop", "on_failure", "dense LU")),
    "robertson": View(("solver", "value+grad (ms)", "gradient error")),
    "lotka": View(("solver", "value+grad (ms)", "gradient error")),
    "poisson": View(("solver", "value+grad (ms)", "gradient error")),
}


def shown(result: Result, view: View) -> tuple[list[str], list[list[Any]]]:
    columns = list(view.columns) or result["columns"]
    rows = view.pick([dict(zip(result["columns"], row)) for row in result["rows"]])
    return columns, [[row[c] for c in columns] for row in rows]


def provenance(result: Result) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    text = (f"`{result['command']}` on {result['date']} at commit `{result['commit']}`; "
            f"{result['machine']}; {versions}. {result['conditions'][0].upper()}"
            f"{result['conditions'][1:]}.")
    if result.get("legend"):
        text += " " + "; ".join(f"*{k}*: {v}" for k, v in result["legend"].items()) + "."
    return text


def page_block(name: str, result: Result) -> str:
    columns, rows = shown(result, VIEWS.get(name, View()))
    note = "\n".join(textwrap.wrap(provenance(result), 86))
    if len(rows) < len(result["rows"]) or len(columns) < len(result["columns"]):
        note += ("\n\nThis table shows the rows and columns that carry the comparison; "
                 "`benchmarks/RESULTS.md` has all of them.")
    lines = [f"*{result['title']}* ({result['unit']}; {result['date']}, "
             f"`{result['commit']}`)", "", *markdown_table(columns, rows), "",
             '??? note "How this was measured"', "",
             textwrap.indent(note, "    ", lambda line: bool(line.strip()))]
    return "\n".join(lines)


def by_dtype(result: Result) -> tuple[list[str], list[list[Any]]]:
    """The kernels' table with one row per kernel and size, a column pair per dtype."""
    dtypes = sorted({row[0] for row in result["rows"]})
    table: dict[tuple[Any, Any], dict[str, list[Any]]] = {}
    for dtype, kernel, size, ours, reference, reference_is in result["rows"]:
        table.setdefault((kernel, size), {})[dtype] = [ours, reference, reference_is]
    columns = ["kernel", "size"] + [f"{d} {w}" for d in dtypes for w in ("ours", "ref")]
    rows = []
    for (kernel, size), cells in table.items():
        rows.append([kernel, size, *[v for d in dtypes for v in cells.get(d, ["-", "-"])[:2]],
                     next(iter(cells.values()))[2]])
    return columns + ["reference is"], rows


RECORD_LAYOUTS: dict[str, Callable[[Result], tuple[list[str], list[list[Any]]]]] = {
    "kernels": by_dtype}


def record_block(name: str, result: Result) -> str:
    layout = RECORD_LAYOUTS.get(name, lambda r: (r["columns"], r["rows"]))
    # the provenance as one paragraph on one line: the record stays short to scroll
    lines = [f"### {result['title']}", "", provenance(result) + f" File: `{name}.json`.", "",
             *markdown_table(*layout(result))]
    return "\n".join(lines)


def render(text: str, results: dict[str, Result], kind: str, path: Path) -> str:
    """`text` with its goals block and every `kind` block rendered from `results`."""
    make = page_block if kind == "results" else record_block

    def block(match: re.Match[str]) -> str:
        name = match[1]
        if name not in results:
            raise SystemExit(f"{path}: no benchmarks/results/{name}.json for its block")
        return f"<!-- {kind}: {name} -->\n{make(name, results[name])}\n<!-- end {kind}: {name} -->"
    text = re.sub(rf"<!-- {kind}: (\w+) -->\n.*?<!-- end {kind}: \1 -->", block, text,
                  flags=re.DOTALL)
    return re.sub(r"<!-- goals -->\n.*?<!-- end goals -->",
                  lambda m: f"<!-- goals -->\n{goals_table(results)}\n<!-- end goals -->", text,
                  flags=re.DOTALL)


def render_page(text: str, results: dict[str, Result]) -> str:
    return render(text, results, "results", PAGE)


def render_record(text: str, results: dict[str, Result]) -> str:
    return render(text, results, "record", RECORD)


# ------------------------------------------------------------------------------- plots
def _save(fig: Any, out: Path, plt: Any) -> None:
    # no matplotlib version in the file: the PNG changes only when the numbers do
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _when(result: Result) -> str:
    return f"{result['date']}, {result['commit']}"


def plot_hostcall(results: dict[str, Result], plt: Any, out: Path) -> None:
    result = results["hostcall"]
    cols = result["columns"]
    mechanisms = ["ours", "buffer_cb", "JAXbind", "pure_cb"]
    dtypes = sorted({r[0] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(10, 4.2), sharey=True, squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        rows = [r for r in result["rows"] if r[0] == dtype and r[2] == "returns"]
        for name in mechanisms:
            j = cols.index(name)
            points = [(int(r[1]), number(r[j])) for r in rows if number(r[j]) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", lw=2.5 if name == "ours" else 1.5,
                        label="jaxbridge" if name == "ours" else name)
        ax.set(xscale="log", yscale="log", xlabel=f"elements ({dtype})", title=dtype)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("µs per call (best of the rounds)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Host call returning a new array, cost against size ({_when(result)})")
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


def plot_ode(results: dict[str, Result], plt: Any, out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, name in zip(axes, ("lotka", "robertson")):
        result = results[name]
        for _, solver, cell, err in result["rows"]:
            ms, error = number(cell), number(err)
            if ms is None or error is None or str(err).startswith("wrong"):
                continue
            ours = solver.startswith("jaxbridge")
            ax.scatter(ms, error, marker="o" if ours else "s",
                       color="tab:blue" if ours else "tab:orange", s=30)
            ax.annotate(solver.replace("jaxbridge solve_ivp ", "").replace("stepping=", "")
                        .replace("diffrax ", "").replace(" rtol=1e-8", ""),
                        (ms, error), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="value + gradient (ms)",
               ylabel="gradient relative error",
               title=f"{result['rows'][0][0]} ({_when(result)})")
        _whole_decades(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].scatter([], [], marker="o", color="tab:blue", label="jaxbridge solve_ivp")
    axes[0].scatter([], [], marker="s", color="tab:orange", label="diffrax")
    axes[0].legend(fontsize=8)
    fig.suptitle("ODE gradients: cost against accuracy")
    fig.tight_layout()
    _save(fig, out, plt)


def plot_kernels(results: dict[str, Result], plt: Any, out: Path) -> None:
    result = results["kernels"]
    dtypes = sorted({r[0] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(11, 7.5), sharey=True, squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
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
    axes[0][0].invert_yaxis()  # the axes share y: once, for the table's order top to bottom
    fig.suptitle(f"Built-in kernels against XLA ({_when(result)})")
    fig.tight_layout()
    _save(fig, out, plt)


def plot_scaling(results: dict[str, Result], plt: Any, out: Path) -> None:
    result = results["scaling"]
    rows = result["rows"]
    devices = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(devices, [r[2] for r in rows], marker="o", label="with a jaxbridge SciPy layer")
    ax.plot(devices, [r[3] for r in rows], marker="s", label="the same model in jnp")
    ax.set(xscale="log", xlabel="CPU devices", ylabel="examples / s",
           title=f"Data-parallel step ({_when(result)})")
    ax.set_xticks(devices, [str(d) for d in devices])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out, plt)


# plot name: (how to draw it, the results files it reads)
PLOTS = {"hostcall": (plot_hostcall, ("hostcall",)),
         "ode_gradients": (plot_ode, ("lotka", "robertson")),
         "kernels": (plot_kernels, ("kernels",)),
         "scaling": (plot_scaling, ("scaling",))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that the page's and the record's tables are up to date")
    args = parser.parse_args(argv)
    results = load()
    stale = []
    for path, render_file in ((PAGE, render_page), (RECORD, render_record)):
        text = path.read_text()
        rendered = render_file(text, results)
        if rendered != text:
            stale.append(path)
            if not args.check:
                path.write_text(rendered)
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python benchmarks/plots.py")
        return 1 if stale else 0
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    PLOT_DIR.mkdir(parents=True, exist_ok=True)
    for name, (plot, _) in PLOTS.items():
        path = PLOT_DIR / f"{name}.png"
        plot(results, plt, path)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
