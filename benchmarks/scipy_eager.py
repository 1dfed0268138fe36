"""A repeat eager call of the `jaxbridge.scipy` drop-ins against SciPy's own call.

A *repeat eager call* is what a notebook or SciPy's own test files do: the same
function object and the same argument shapes and dtypes, called again outside `jit`.
Each case runs SciPy (the user's function written in NumPy) and the drop-in (the
same function written in `jax.numpy`, as users port it) side by side in one run, and
compares the drop-in's time with the goal of issue #44 item 8: within 2x SciPy's
own time plus 100 us.

Each case is warmed up first (the first call traces and compiles); then rounds
alternate SciPy and the drop-in, each round timing `--calls` calls of one and of
the other; a figure is the median over rounds of the per-call time. The machine may
be shared: compare the ratios, and rerun on a quiet machine for figures.

`--clock cpu` times the process's CPU time (all its threads) instead of wall time:
steadier where other processes load the machine.

Usage: `python benchmarks/scipy_eager.py [--repeats N] [--calls K] [--clock wall|cpu]
[--only NAME ...] [--json [DIR]]` (`--json` writes scipy_eager.json into
benchmarks/results/; one recorded run: benchmarks/results/scipy-eager-2026-11-29/).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402 - after x64 is set
import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.optimize  # noqa: E402
import scipy.signal  # noqa: E402
import scipy.sparse.linalg  # noqa: E402
import scipy.special  # noqa: E402
from record import Table, add_json_option  # noqa: E402

import jaxbridge.scipy.integrate as jb_integrate  # noqa: E402
import jaxbridge.scipy.optimize as jb_optimize  # noqa: E402
import jaxbridge.scipy.signal as jb_signal  # noqa: E402
import jaxbridge.scipy.sparse.linalg as jb_sparse_linalg  # noqa: E402
import jaxbridge.scipy.special as jb_special  # noqa: E402

GOAL_FACTOR, GOAL_OFFSET_US = 2.0, 100.0


def _ready(out: Any) -> Any:
    """Wait for every array in `out` (results are pytrees, tuples or plain arrays)."""
    leaves = jax.tree_util.tree_leaves(out)
    return [jax.block_until_ready(x) for x in leaves if isinstance(x, jax.Array)]


# ------------------------------------------------------------------ the cases
# Each case: name -> (SciPy's call, the drop-in's call), both without arguments.
def _ivp_cases() -> dict[str, tuple[Callable, Callable]]:
    y0 = np.array([2.0, 4.0, 8.0])
    t_eval = np.linspace(0.0, 10.0, 11)

    def np_decay(t: float, y: np.ndarray) -> np.ndarray:
        return -0.5 * y

    def jnp_decay(t: Any, y: Any) -> Any:
        return -0.5 * y

    def np_hit(t: float, y: np.ndarray) -> float:
        return y[0] - 1.0

    def jnp_hit(t: Any, y: Any) -> Any:
        return y[0] - 1.0

    return {
        "solve_ivp RK45 t_eval": (
            lambda: scipy.integrate.solve_ivp(np_decay, (0.0, 10.0), y0, t_eval=t_eval),
            lambda: jb_integrate.solve_ivp(jnp_decay, (0.0, 10.0), y0, t_eval=t_eval)),
        "solve_ivp RK45 dense_output": (
            lambda: scipy.integrate.solve_ivp(np_decay, (0.0, 10.0), y0, dense_output=True),
            lambda: jb_integrate.solve_ivp(jnp_decay, (0.0, 10.0), y0, dense_output=True)),
        "solve_ivp dense sol(t), 11 t": (
            _sol_call(scipy.integrate.solve_ivp(np_decay, (0.0, 10.0), y0,
                                                dense_output=True).sol, t_eval),
            _sol_call(jb_integrate.solve_ivp(jnp_decay, (0.0, 10.0), y0,
                                             dense_output=True).sol, t_eval)),
        "solve_ivp RK45 events": (
            lambda: scipy.integrate.solve_ivp(np_decay, (0.0, 10.0), y0, t_eval=t_eval,
                                              events=np_hit),
            lambda: jb_integrate.solve_ivp(jnp_decay, (0.0, 10.0), y0, t_eval=t_eval,
                                           events=jnp_hit)),
    }


def _sol_call(sol: Callable, t: np.ndarray) -> Callable:
    return lambda: sol(t)


def _signal_cases() -> dict[str, tuple[Callable, Callable]]:
    rng = np.random.default_rng(0)
    b, a = np.array([0.2, 0.3, 0.2]), np.array([1.0, -0.5, 0.1])
    cases = {}
    for n in (1_000, 100_000):
        x = rng.standard_normal(n)
        cases[f"lfilter n={n:,}"] = (
            (lambda x=x: scipy.signal.lfilter(b, a, x)),
            (lambda x=x: jb_signal.lfilter(b, a, x)))
    return cases


def _optimize_cases() -> dict[str, tuple[Callable, Callable]]:
    def np_res(x: np.ndarray) -> np.ndarray:
        return np.array([x[0] + 0.5 * (x[0] - x[1]) ** 3 - 1.0,
                         0.5 * (x[1] - x[0]) ** 3 + x[1]])

    def jnp_res(x: Any) -> Any:
        return jnp.array([x[0] + 0.5 * (x[0] - x[1]) ** 3 - 1.0,
                          0.5 * (x[1] - x[0]) ** 3 + x[1]])

    def np_rosen(x: np.ndarray) -> float:
        return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))

    def jnp_rosen(x: Any) -> Any:
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

    def np_lsq(x: np.ndarray) -> np.ndarray:
        return np.array([10 * (x[1] - x[0] ** 2), 1 - x[0]])

    def jnp_lsq(x: Any) -> Any:
        return jnp.array([10 * (x[1] - x[0] ** 2), 1 - x[0]])

    x0 = np.zeros(2)
    r0 = np.array([-1.2, 1.0])
    return {
        "root hybr n=2": (lambda: scipy.optimize.root(np_res, x0),
                          lambda: jb_optimize.root(jnp_res, x0)),
        "minimize BFGS rosen n=2": (
            lambda: scipy.optimize.minimize(np_rosen, r0, method="BFGS",
                                            jac=scipy.optimize.rosen_der),
            lambda: jb_optimize.minimize(jnp_rosen, r0, method="BFGS")),
        "least_squares n=2": (lambda: scipy.optimize.least_squares(np_lsq, r0),
                              lambda: jb_optimize.least_squares(jnp_lsq, r0)),
    }


def _other_cases() -> dict[str, tuple[Callable, Callable]]:
    A = np.diag(np.arange(1.0, 101.0)) + 0.1 * (np.eye(100, k=1) + np.eye(100, k=-1))
    x1000 = np.linspace(0.1, 5.0, 1000)
    def np_gauss(x: float) -> float:
        return np.exp(-x * x)

    def jnp_gauss(x: Any) -> Any:
        return jnp.exp(-x * x)

    return {
        "quad exp(-x^2) [0, 3]": (lambda: scipy.integrate.quad(np_gauss, 0.0, 3.0),
                                  lambda: jb_integrate.quad(jnp_gauss, 0.0, 3.0)),
        "eigsh dense n=100 k=3": (
            lambda: scipy.sparse.linalg.eigsh(A, k=3, v0=np.ones(100)),
            lambda: jb_sparse_linalg.eigsh(A, k=3, v0=np.ones(100))),
        "special.kv scalar": (lambda: scipy.special.kv(1.5, 2.0),
                              lambda: jb_special.kv(1.5, 2.0)),
        "special.kv n=1,000": (lambda: scipy.special.kv(1.5, x1000),
                               lambda: jb_special.kv(1.5, x1000)),
        "special.erfcx scalar": (lambda: scipy.special.erfcx(2.0),
                                 lambda: jb_special.erfcx(2.0)),
        "special.erfcx n=1,000": (lambda: scipy.special.erfcx(x1000),
                                  lambda: jb_special.erfcx(x1000)),
    }


def cases() -> dict[str, tuple[Callable, Callable]]:
    return {**_ivp_cases(), **_signal_cases(), **_optimize_cases(), **_other_cases()}


# ------------------------------------------------------------------ timing
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _per_call_us(call: Callable, calls: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(calls):
        _ready(call())
    return (clock() - start) / calls * 1e6


def measure(scipy_call: Callable, ours: Callable, repeats: int, calls: int,
            clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(SciPy's, ours) median per-call time in us over interleaved rounds."""
    for _ in range(2):  # the first call traces and compiles: not a repeat call
        scipy_call()
        _ready(ours())
    theirs_us, ours_us = [], []
    for _ in range(repeats):
        theirs_us.append(_per_call_us(scipy_call, calls, clock))
        ours_us.append(_per_call_us(ours, calls, clock))
    return statistics.median(theirs_us), statistics.median(ours_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=10, help="calls per round and side")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run the cases whose name contains one of these words")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (default), or the process's CPU time (all its "
                             "threads), steadier on a machine others load")
    add_json_option(parser)
    args = parser.parse_args()
    table = Table(
        "scipy_eager", "A repeat eager call: jaxbridge.scipy against SciPy (issue #44 item 8)",
        "us per call, median over rounds",
        ["case", "SciPy", "jaxbridge", "ours / SciPy", "goal (2x SciPy + 100 us)",
         "ours / goal"],
        method=f"{args.repeats} interleaved rounds of {args.calls} calls each, after two "
               f"warm-up calls, {args.clock} time; user functions in NumPy for SciPy, "
               f"jax.numpy for ours",
        legend={"ours / goal": "below 1 meets the goal"})
    print(f"{'case':32s} {'SciPy us':>10s} {'ours us':>10s} {'ours/SciPy':>10s} "
          f"{'goal us':>10s} {'ours/goal':>10s}")
    for name, (scipy_call, ours) in cases().items():
        if args.only and not any(word in name for word in args.only):
            continue
        theirs_us, ours_us = measure(scipy_call, ours, args.repeats, args.calls,
                                     CLOCKS[args.clock])
        goal = GOAL_FACTOR * theirs_us + GOAL_OFFSET_US
        print(f"{name:32s} {theirs_us:10.1f} {ours_us:10.1f} {ours_us / theirs_us:10.2f} "
              f"{goal:10.1f} {ours_us / goal:10.2f}", flush=True)
        table.add([name, round(theirs_us, 1), round(ours_us, 1),
                   round(ours_us / theirs_us, 2), round(goal, 1), round(ours_us / goal, 2)])
    table.save(args.json)


if __name__ == "__main__":
    main()
