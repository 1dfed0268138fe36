"""Fit a drag coefficient so that a projectile lands on a target, through a terminal event.

A ball is fired at 20 m/s, 45 degrees up, with quadratic air drag `cd |v| v`. The
flight ends when it hits the ground: a terminal event (`ground.terminal = True`,
`ground.direction = -1`, SciPy's contract), located by SciPy's own `solve_ivp`. The
landing distance is the state at the event, `x(t*)`, and its gradient with respect
to `cd` goes through the event time by the implicit function theorem
(`dt*/dcd = -(g_y dy/dcd) / (g_y f)` with `g = y`), which jaxbridge adds on top of
forward sensitivities. We check that gradient against central differences of the
solve itself, then find the drag that makes the ball land at 25 m with Newton steps
on `x(t*) - 25`, the whole step under `jax.jit`.

Writes projectile_events.png (the trajectories along the fit) to `--out DIR` (default
a new temporary directory) when matplotlib is installed. Prints OK when the gradient
check and the fit succeed; exits non-zero otherwise.
"""

import argparse
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxbridge.scipy.integrate import solve_ivp

jax.config.update("jax_enable_x64", True)

G = 9.81
V0 = 20.0
TARGET = 25.0  # m
S0 = jnp.array([0.0, 0.0, V0 / np.sqrt(2), V0 / np.sqrt(2)])  # x, y, vx, vy


def flight(t, s, cd):
    x, y, vx, vy = s
    v = jnp.sqrt(vx ** 2 + vy ** 2)
    return jnp.stack([vx, vy, -cd * v * vx, -G - cd * v * vy])


def ground(t, s, cd):
    return s[1]


ground.terminal = True
ground.direction = -1


def land(cd, dense=False):
    """(landing distance, flight time, solution) for drag coefficient cd."""
    sol = solve_ivp(flight, (0.0, 10.0), S0, "DOP853", events=ground, args=(cd,),
                    dense_output=dense, t_eval=None if dense else jnp.zeros(0), rtol=1e-10,
                    atol=1e-10, max_events=1)
    return sol.y_events[0][0, 0], sol.t_events[0][0], sol


@jax.jit
def newton_step(cd):
    miss, slope = jax.value_and_grad(lambda c: land(c)[0] - TARGET)(cd)
    return cd - miss / slope, miss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the PNG (default: a temp dir)")
    out = pathlib.Path(parser.parse_args().out or tempfile.mkdtemp(prefix="projectile_"))
    ok = True

    # 1. The gradient through the terminal event vs central differences.
    cd0 = 0.01
    g = float(jax.grad(lambda c: land(c)[0])(cd0))
    eps = 1e-6
    g_fd = float((land(cd0 + eps)[0] - land(cd0 - eps)[0]) / (2 * eps))
    t_g = float(jax.grad(lambda c: land(c)[1])(cd0))
    print(f"d(distance)/d(cd) = {g:.6f} (finite differences {g_fd:.6f}); "
          f"d(flight time)/d(cd) = {t_g:.6f}")
    if not abs(g - g_fd) <= 1e-5 * abs(g_fd):
        print("FAILED: the gradient disagrees with finite differences")
        ok = False

    # 2. Newton on the miss distance.
    cds = [cd0]
    for i in range(8):
        cd, miss = newton_step(cds[-1])
        print(f"step {i}: cd = {float(cds[-1]):.6f}, miss = {float(miss):+.3e} m")
        cds.append(float(cd))
        if abs(float(miss)) < 1e-9:
            break
    dist, t_star, _ = land(cds[-1])
    print(f"cd = {cds[-1]:.6f}: lands at {float(dist):.9f} m after {float(t_star):.4f} s")
    if not abs(float(dist) - TARGET) < 1e-6:
        print("FAILED: the fit did not reach the target")
        ok = False

    # 3. The trajectories along the fit, from the dense output (a JAX function).
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
    else:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for c in cds:
            _, t_star, sol = land(c, dense=True)
            ts = jnp.linspace(0.0, t_star, 100)
            xy = sol.sol(ts)
            ax.plot(xy[0], xy[1], label=f"cd = {c:.4f}")
        ax.axvline(TARGET, color="k", ls="--", lw=0.8)
        ax.set_xlabel("x (m)")
        ax.set_ylabel("height (m)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        out.mkdir(parents=True, exist_ok=True)
        path = out / "projectile_events.png"
        fig.savefig(path, dpi=100)
        print(f"wrote {path}")
    if ok:
        print("OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
