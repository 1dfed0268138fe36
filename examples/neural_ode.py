"""Fit a neural ODE to Lotka-Volterra trajectories, trained through SciPy's RK45.

The data: predator-prey trajectories `y' = (a y0 - b y0 y1, -c y1 + d y0 y1)` from
four initial states, computed by `scipy.integrate.solve_ivp` itself. The model:
`y' = MLP(y)` (2-32-32-2, tanh), integrated by `jaxbridge.scipy.integrate.solve_ivp`
with SciPy's RK45 (the step loop compiled into the training step; the gradient is
the discrete adjoint of the accepted steps), `vmap`ped over the initial states as one
batched solve. Training: optax's Adam in a `jax.jit`-compiled step, with a tqdm
progress bar. At the end the script saves a PNG of data against fit (to `--out DIR`,
default a new temporary directory; needs matplotlib) and prints OK when the relative
RMS error of the fit is under THRESHOLD.
"""

import argparse
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.integrate
from tqdm import tqdm

from jaxbridge.scipy.integrate import solve_ivp

jax.config.update("jax_enable_x64", True)

THRESHOLD = 0.05  # relative RMS error of the fitted trajectories
ABC = (1.5, 1.0, 3.0, 1.0)
T_END = 3.0
TS = np.linspace(0.1, T_END, 24)
Y0S = np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 2.0], [1.5, 0.5]])


def lotka_volterra(t, y, a, b, c, d):
    return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]


def data() -> np.ndarray:
    """(4, 2, T) trajectories by SciPy itself."""
    out = []
    for y0 in Y0S:
        sol = scipy.integrate.solve_ivp(lotka_volterra, (0.0, T_END), y0, t_eval=TS,
                                        args=ABC, rtol=1e-10, atol=1e-10)
        assert sol.success, sol.message
        out.append(sol.y)
    return np.stack(out)


def init(key: jax.Array, widths=(2, 32, 32, 2)) -> list:
    keys = jax.random.split(key, len(widths) - 1)
    return [(jax.random.normal(k, (a, b)) * 0.5 / np.sqrt(a), jnp.zeros(b))
            for k, a, b in zip(keys, widths[:-1], widths[1:])]


def field(t, y, params):
    h = y
    for W, b in params[:-1]:
        h = jnp.tanh(h @ W + b)
    W, b = params[-1]
    return h @ W + b


def predict(params, y0s):
    """(batch, 2, T): one batched solve over the initial states (vmap)."""
    def one(y0):
        return solve_ivp(field, (0.0, T_END), y0, "RK45", TS, args=(params,), rtol=1e-5,
                         atol=1e-7, on_failure="nan").y
    return jax.vmap(one)(y0s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", default=None, help="directory for the PNG")
    args = parser.parse_args()
    ys = jnp.asarray(data())
    y0s = jnp.asarray(Y0S)
    scale = jnp.sqrt(jnp.mean(ys ** 2))

    def loss(params):
        return jnp.mean((predict(params, y0s) - ys) ** 2) / scale ** 2

    params = init(jax.random.PRNGKey(0))
    opt = optax.adam(optax.exponential_decay(2e-2, args.steps, 0.1))
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        value, grad = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grad, state, params)
        return optax.apply_updates(params, updates), state, value

    bar = tqdm(range(args.steps), desc="neural ODE", mininterval=1.0)
    for _ in bar:
        params, state, value = step(params, state)
        bar.set_postfix(loss=f"{float(value):.2e}", refresh=False)
    error = float(jnp.sqrt(loss(params)))
    print(f"relative RMS error of the fit: {error:.4f} (threshold {THRESHOLD})")

    out = args.out or tempfile.mkdtemp(prefix="neural_ode_")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
    else:
        fit = np.asarray(predict(params, y0s))
        fig, axes = plt.subplots(1, len(Y0S), figsize=(4 * len(Y0S), 3), sharey=True)
        for i, ax in enumerate(axes):
            for j, name in enumerate(("prey", "predator")):
                ax.plot(TS, ys[i, j], "o", ms=3, label=f"{name} (data)")
                ax.plot(TS, fit[i, j], "-", label=f"{name} (neural ODE)")
            ax.set_title(f"y0 = ({Y0S[i, 0]:g}, {Y0S[i, 1]:g})")
            ax.set_xlabel("t")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, "neural_ode_fit.png")
        fig.savefig(path, dpi=80)
        print(f"saved {path}")
    if not error < THRESHOLD:
        print(f"FAILED: error {error:.4f} is not under {THRESHOLD}")
        raise SystemExit(1)
    print("OK")


if __name__ == "__main__":
    main()
