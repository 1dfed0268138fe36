"""d(impact time)/d(drag) of a cannonball: jaxbridge's SciPy events vs diffrax's Event.

The problem of diffrax issue #451 (a cannonball in flight-path coordinates: range,
height, speed, flight-path angle; drag `0.5 rho v^2 S CD`), fired horizontally at
5 m/s from 100 m (`gamma0 = 0`, CD = 0.5; the issue's own initial angle and CD are
not recoverable from its text, so this is our instance of it). The flight ends when
the height crosses zero. We time a jitted `value_and_grad` of the impact time with
respect to CD and score the gradient against central finite differences of SciPy's
own `solve_ivp` (DOP853 at rtol = atol = 1e-12, with its own event location).

* ours: `jaxbridge.scipy.integrate.solve_ivp(events=ground)` with ground.terminal,
  RK45 and DOP853, rtol = atol = 1e-8 (SciPy locates the event; the gradient is the
  implicit function theorem over forward sensitivities);
* diffrax: `diffeqsolve(Tsit5(), PIDController(1e-8, 1e-8),
  event=Event(cond_fn, optimistix.Newton))`, RecursiveCheckpointAdjoint, the
  impact time is `sol.ts[-1]`.

Each contender runs once to compile, then the rounds are interleaved (ours, theirs,
ours, ...) and the median and the spread (min-max) of the rounds are reported.
Run: python benchmarks/ode_events.py [--rounds N]   (about a minute).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
from record import Table, add_json_option

from jaxbridge.scipy.integrate import solve_ivp

jax.config.update("jax_enable_x64", True)

CD = 0.5
Y0 = np.array([0.0, 100.0, 5.0, 0.0])  # range, height, speed, flight-path angle
T1 = 20.0


def dynamics(t, y, cd, np_=jnp):
    g, rho, S, m = 9.80665, 1.225, 0.005, 1.0
    v, gam = y[2], y[3]
    D = 0.5 * rho * v ** 2 * S * cd
    return np_.stack([v * np_.cos(gam), v * np_.sin(gam), -D / m - g * np_.sin(gam),
                      -(g * np_.cos(gam)) / v])


def ground(t, y, cd):
    return y[1]


ground.terminal = True
ground.direction = -1


def ours(method):
    def impact(cd):
        sol = solve_ivp(dynamics, (0.0, T1), jnp.asarray(Y0), method, t_eval=jnp.zeros(0),
                        events=ground, args=(cd,), rtol=1e-8, atol=1e-8, max_events=1)
        return sol.t_events[0][0]
    return jax.jit(jax.value_and_grad(impact))


def theirs():
    import diffrax
    import optimistix

    def impact(cd):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, cd: dynamics(t, y, cd)), diffrax.Tsit5(), 0.0, T1,
            None, jnp.asarray(Y0), args=cd,
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
            event=diffrax.Event(lambda t, y, args, **kw: y[1],
                                root_finder=optimistix.Newton(rtol=1e-12, atol=1e-12)),
            saveat=diffrax.SaveAt(t1=True), max_steps=100_000)
        return sol.ts[-1]
    return jax.jit(jax.value_and_grad(impact))


def reference() -> tuple[float, float]:
    """SciPy's own impact time and central differences of it (DOP853, 1e-12)."""
    def t_star(cd):
        ev = lambda t, y: y[1]  # noqa: E731
        ev.terminal, ev.direction = True, -1
        r = scipy.integrate.solve_ivp(lambda t, y: dynamics(t, y, cd, np), (0.0, T1), Y0,
                                      "DOP853", events=ev, rtol=1e-12, atol=1e-12)
        assert r.status == 1, r.message
        return r.t_events[0][0]
    eps = 1e-5
    return t_star(CD), (t_star(CD + eps) - t_star(CD - eps)) / (2 * eps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    add_json_option(parser)
    args = parser.parse_args()
    rounds = args.rounds
    t_ref, g_ref = reference()
    record = Table(
        "events", "ODE events: jitted value_and_grad of a cannonball's impact time with "
        "respect to the drag coefficient", "ms per call",
        ["contender (rtol = atol = 1e-8)", "t*", "dt*/dCD", "gradient rel. error", "median ms",
         "min-max ms"],
        method=(f"{rounds} interleaved rounds after one compile, median and min-max; "
                "reference: central differences of SciPy's solve_ivp (DOP853, rtol = atol = "
                f"1e-12), t* = {t_ref:.10f} s, dt*/dCD = {g_ref:.10f}"),
        legend={"ours RK45": "SciPy's event location + the implicit function theorem",
                "diffrax Tsit5 + Event": "diffrax's Event located by optimistix Newton"},
        packages=("diffrax", "optimistix"))
    print(f"reference (SciPy DOP853 1e-12, central differences): t* = {t_ref:.10f} s, "
          f"dt*/dCD = {g_ref:.10f}")
    contenders = {"ours RK45": ours("RK45"), "ours DOP853": ours("DOP853")}
    try:
        contenders["diffrax Tsit5 + Event"] = theirs()
    except ImportError as err:
        print(f"diffrax not installed ({err}): its row is skipped")
    cd = jnp.float64(CD)
    results, times = {}, {name: [] for name in contenders}
    for name, f in contenders.items():
        results[name] = jax.block_until_ready(f(cd))  # compile
    for _ in range(rounds):
        for name, f in contenders.items():
            start = time.perf_counter()
            jax.block_until_ready(f(cd))
            times[name].append(time.perf_counter() - start)
    print(f"{'contender':24s} {'t*':>14s} {'dt*/dCD':>14s} {'grad rel err':>12s} "
          f"{'median ms':>10s} {'min-max ms':>16s}")
    for name in contenders:
        t, g = (float(v) for v in results[name])
        ts = np.array(times[name]) * 1e3
        print(f"{name:24s} {t:14.10f} {g:14.10f} {abs(g - g_ref) / abs(g_ref):12.2e} "
              f"{statistics.median(ts):10.2f} {ts.min():7.2f}-{ts.max():7.2f}")
        record.add([name, f"{t:.10f}", f"{g:.10f}", f"{abs(g - g_ref) / abs(g_ref):.1e}",
                    f"{statistics.median(ts):.1f}", f"{ts.min():.1f}-{ts.max():.1f}"])
    record.save(args.json)


if __name__ == "__main__":
    main()
