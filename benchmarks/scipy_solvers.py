"""jaxbridge.scipy solvers side by side with pure-JAX solvers: time to value+gradient, error.

Three problems, each timed as a jitted value_and_grad (best of a few runs after a
warm-up) and scored by the gradient's relative error (max-norm) against a reference:

1. Robertson kinetics (stiff), gradient w.r.t. its 3 log rate constants:
   ours (SciPy BDF / LSODA / Radau with SciPy's forward sensitivities, or the compiled
   Radau IIA adjoint over SciPy's recorded steps) vs diffrax Kvaerno5 vs diffrax Tsit5
   (non-stiff). Reference: central finite differences of SciPy Radau at rtol 1e-12.
2. Lotka-Volterra (non-stiff), gradient w.r.t. its 4 parameters and y0: ours
   (SciPy RK45 / DOP853 with the step loop compiled, `stepping="compiled"`, the default;
   and SciPy's own Python loop, `stepping="scipy"`, and LSODA) vs diffrax Tsit5
   (RecursiveCheckpointAdjoint and BacksolveAdjoint), in one run.
   Reference: diffrax Dopri8 at rtol 1e-12.
3. Neural ODE: MLP vector fields with P ~ 300, 3,000 and 30,000 parameters, RK45 over
   [0, 10] at rtol = atol = 1e-7, 20 outputs: ours (compiled loop, discrete adjoint)
   vs diffrax Tsit5 + RecursiveCheckpointAdjoint, interleaved repeats (median and
   range), gradient error against diffrax Dopri8 at rtol 1e-12, and each compiled
   program's XLA temporary memory (`memory_analysis().temp_size_in_bytes`).
3b. Stiff neural ODE (`stiff_mlp`): y' = -diag(lam) y + MLP(y), P ~ 300 and 2,500:
   ours (LSODA / BDF, compiled adjoint) vs diffrax Kvaerno5, interleaved repeats.
4. Implicit layer (DEQ) z = tanh(W z + U x), value+grad in W and U, at batch 16 x
   width 32 and batch 64 x width 256: ours (`optimize.root`: df-sane and krylov
   compiled, the default, and SciPy's loops) vs optimistix (fixed_point + FixedPointIteration,
   root_find Newton + GMRES; ImplicitAdjoint with lineax.GMRES, and with its default
   dense solver at the small size), interleaved repeats (median, range), ratios to the
   faster optimistix row. Gradient error against a tight jnp fixed-point iteration.
5. 2-D Poisson, 5-point stencil, ~1e5 unknowns, gradient w.r.t. b and the matrix's
   nonzeros: ours (`spsolve`, one SuperLU factorization for both solves) vs
   `jax.scipy.sparse.linalg.cg` (gradient w.r.t. b only; CG's own adjoint is another
   CG) to the same accuracy. Reference: each other / the residual.

diffrax is optional: its rows are skipped with a note if it is not installed.
Run: python benchmarks/scipy_solvers.py [section ...] [--json [DIR]]  (about 2-4 minutes on
a laptop CPU; sections: robertson lotka neural_ode stiff_mlp deq poisson). With --json,
each section's rows are also written to benchmarks/results/SECTION.json (see
benchmarks/record.py).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
from record import Table, add_json_option

from jaxbridge.scipy.integrate import solve_ivp
from jaxbridge.scipy.sparse.linalg import spsolve

jax.config.update("jax_enable_x64", True)

try:
    import diffrax
except ImportError:  # pragma: no cover
    diffrax = None
try:
    import lineax
    import optimistix
except ImportError:  # pragma: no cover
    optimistix = None

ROWS: list[tuple[str, str, str, str]] = []
# The section running now: its rows also go to its results file (--json)
SECTION: Table | None = None
COLUMNS = ["problem", "solver", "value+grad (ms)", "gradient error"]
SECTIONS = {  # name: (title, method)
    "robertson": ("Robertson kinetics (stiff): value+grad in 3 log rate constants, 10 outputs "
                  "over [0, 100]", "jitted value_and_grad, best of 3 after a warm-up; gradient "
                  "error: max-norm relative error against central differences of SciPy Radau "
                  "at rtol 1e-12"),
    "lotka": ("Lotka-Volterra (non-stiff): value+grad in 4 parameters and y0, 100 outputs "
              "over [0, 30]", "jitted value_and_grad, best of 3 after a warm-up; gradient "
              "error against diffrax Dopri8 at rtol 1e-12"),
    "neural_ode": ("Neural ODE with an MLP vector field: RK45 (ours, discrete adjoint) against "
                   "diffrax Tsit5 + RecursiveCheckpointAdjoint", "rtol = atol = 1e-7 over "
                   "[0, 10], 20 outputs; 7 interleaved repeats, median; gradient error against "
                   "diffrax Dopri8 at rtol 1e-12"),
    "stiff_mlp": ("Stiff neural ODE y' = -diag(1e3, 1e2, 1, 0.1) y + MLP(y): ours with "
                  "sensitivity='adjoint' against diffrax Kvaerno5", "n = 4, rtol 1e-6, atol "
                  "1e-9, 10 outputs over [0, 5], loss sum(y^2); interleaved repeats, median; "
                  "gradient error against ours with Radau at rtol 1e-11"),
    "deq": ("DEQ layer z = tanh(W z + U x): value+grad in W and U against optimistix",
            "jitted value_and_grad of sum(sin(z*)), warm, 15 interleaved rounds whose order "
            "rotates, median; gradient error against JAX autodiff of a 300-step jnp "
            "fixed-point iteration (float64)"),
    "poisson": ("Sparse solve (2-D Poisson, 1e5 unknowns): value+grad",
                "best of 2 after a warm-up; accuracy as the adjoint system's residual"),
}


def milliseconds(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def bench(fn, *args, repeat=3):
    out = fn(*args)
    jax.block_until_ready(out)
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best, out


def rel_err(g, ref):
    g, ref = np.ravel(np.asarray(g)), np.ravel(np.asarray(ref))
    return float(np.max(np.abs(g - ref)) / np.max(np.abs(ref)))


def row(problem, solver, seconds, err):
    ROWS.append((problem, solver, "n/a" if seconds is None else milliseconds(seconds),
                 err if isinstance(err, str) else f"{err:.1e}"))
    print(f"  {solver:44s} {ROWS[-1][2]:>9} ms   grad rel. error {ROWS[-1][3]}", flush=True)
    if SECTION is not None:
        SECTION.add(list(ROWS[-1]))


# ------------------------------------------------------------------ 1. Robertson
def robertson(t, y, logk):
    k1, k2, k3 = jnp.exp(logk)
    y1, y2, y3 = y
    return jnp.stack([-k1 * y1 + k3 * y2 * y3, k1 * y1 - k2 * y2 ** 2 - k3 * y2 * y3,
                      k2 * y2 ** 2])


def robertson_bench():
    print("Robertson (stiff), d/d log k, t in [0, 100], 10 outputs", flush=True)
    logk = jnp.log(jnp.array([0.04, 3e7, 1e4]))
    te = jnp.geomspace(1e-2, 100.0, 10)
    y0 = jnp.array([1.0, 0.0, 0.0])
    w = jnp.array([1.0, 1e4, 1.0])

    def loss_of(ys):  # ys: (T, 3)
        return jnp.sum(jnp.sin(ys * w[None, :]))

    def scipy_loss(lk):
        sol = scipy.integrate.solve_ivp(
            lambda t, y: np.asarray(robertson(t, jnp.asarray(y), lk)), (0.0, 100.0),
            np.asarray(y0), method="Radau", t_eval=np.asarray(te), rtol=1e-12, atol=1e-16,
            jac=lambda t, y: np.asarray(jax.jacfwd(robertson, 1)(t, jnp.asarray(y), lk)))
        return float(loss_of(jnp.asarray(sol.y.T)))

    eps = 1e-5
    ref = np.array([(scipy_loss(logk.at[i].add(eps)) - scipy_loss(logk.at[i].add(-eps)))
                    / (2 * eps) for i in range(3)])

    for method, sensitivity, rtol, atol in (
            ("BDF", "forward", 1e-6, 1e-10), ("BDF", "forward", 1e-8, 1e-12),
            ("BDF", "adjoint", 1e-6, 1e-10), ("BDF", "adjoint", 1e-8, 1e-12),
            ("LSODA", "forward", 1e-6, 1e-10), ("LSODA", "forward", 1e-7, 1e-11),
            ("LSODA", "forward", 1e-8, 1e-12), ("LSODA", "adjoint", 1e-6, 1e-10),
            ("LSODA", "adjoint", 1e-8, 1e-12), ("Radau", "adjoint", 1e-8, 1e-12)):
        f = jax.jit(jax.value_and_grad(lambda lk: loss_of(solve_ivp(
            robertson, (0.0, 100.0), y0, method, te, args=(lk,), rtol=rtol, atol=atol,
            sensitivity=sensitivity).y.T)))
        s, (_, g) = bench(f, logk)
        row("Robertson", f"jaxbridge solve_ivp {method} {sensitivity} rtol={rtol:g}", s,
            rel_err(g, ref))

    if diffrax is None:
        row("Robertson", "diffrax (not installed)", None, "skipped")
        return
    for name, solver, rtol, atol in (("Kvaerno5", diffrax.Kvaerno5(), 1e-6, 1e-10),
                                     ("Kvaerno5", diffrax.Kvaerno5(), 1e-8, 1e-12),
                                     ("Tsit5 (non-stiff)", diffrax.Tsit5(), 1e-6, 1e-10)):
        def dl(lk, solver=solver, rtol=rtol, atol=atol):
            sol = diffrax.diffeqsolve(
                diffrax.ODETerm(robertson), solver, 0.0, 100.0, 1e-6, y0, args=lk,
                saveat=diffrax.SaveAt(ts=te), max_steps=200_000, throw=False,
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol))
            return loss_of(sol.ys)
        f = jax.jit(jax.value_and_grad(dl))
        try:
            s, (_, g) = bench(f, logk, repeat=1 if "Tsit5" in name else 3)
            err = rel_err(g, ref) if np.all(np.isfinite(g)) else float("inf")
            if err > 1:
                err = f"wrong ({err:.0e}): hit max_steps=200000, stiff"
        except Exception as exc:  # noqa: BLE001
            s, err = None, f"error: {type(exc).__name__}"
        row("Robertson", f"diffrax {name} rtol={rtol:g}", s, err)


# ------------------------------------------------------------------ 2. Lotka-Volterra
def lotka(t, y, p):
    a, b, c, d = p
    return jnp.stack([a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]])


def lotka_bench():
    print("Lotka-Volterra (non-stiff), d/d(params, y0), t in [0, 30], 100 outputs", flush=True)
    p = jnp.array([1.5, 1.0, 3.0, 1.0])
    y0 = jnp.array([1.0, 1.0])
    te = jnp.linspace(0.3, 30.0, 100)

    def loss_of(ys):
        return jnp.sum(ys ** 2) / ys.shape[0]

    ref = None
    if diffrax is not None:
        def dl(p, y0, solver=diffrax.Dopri8(), rtol=1e-12, atol=1e-12):
            sol = diffrax.diffeqsolve(diffrax.ODETerm(lotka), solver, 0.0, 30.0, 1e-3, y0,
                                      args=p, saveat=diffrax.SaveAt(ts=te), max_steps=100_000,
                                      stepsize_controller=diffrax.PIDController(rtol=rtol,
                                                                                atol=atol))
            return loss_of(sol.ys)
        ref = np.concatenate(jax.grad(dl, (0, 1))(p, y0))
    else:
        ref_f = jax.grad(lambda p, y0: loss_of(solve_ivp(
            lotka, (0.0, 30.0), y0, "DOP853", te, args=(p,), rtol=1e-12, atol=1e-12).y.T),
            (0, 1))
        ref = np.concatenate(ref_f(p, y0))

    for method, stepping in (("RK45", "compiled"), ("DOP853", "compiled"), ("RK45", "scipy"),
                             ("DOP853", "scipy"), ("LSODA", "scipy")):
        f = jax.jit(jax.value_and_grad(lambda p, y0, method=method, stepping=stepping: loss_of(
            solve_ivp(lotka, (0.0, 30.0), y0, method, te, args=(p,), rtol=1e-8, atol=1e-8,
                      stepping=stepping).y.T), (0, 1)))
        s, (_, g) = bench(f, p, y0)
        row("Lotka-Volterra", f"jaxbridge solve_ivp {method} stepping={stepping} rtol=1e-8", s,
            rel_err(np.concatenate(g), ref))
    if diffrax is None:
        row("Lotka-Volterra", "diffrax (not installed)", None, "skipped")
        return
    for adjoint, aname in ((diffrax.RecursiveCheckpointAdjoint(), "checkpoint adjoint"),
                           (diffrax.BacksolveAdjoint(), "backsolve adjoint")):
        def dl(p, y0, adjoint=adjoint):
            sol = diffrax.diffeqsolve(diffrax.ODETerm(lotka), diffrax.Tsit5(), 0.0, 30.0, 1e-3,
                                      y0, args=p, saveat=diffrax.SaveAt(ts=te),
                                      adjoint=adjoint,
                                      stepsize_controller=diffrax.PIDController(rtol=1e-8,
                                                                                atol=1e-8))
            return loss_of(sol.ys)
        f = jax.jit(jax.value_and_grad(dl, (0, 1)))
        s, (_, g) = bench(f, p, y0)
        row("Lotka-Volterra", f"diffrax Tsit5 {aname} rtol=1e-8", s,
            rel_err(np.concatenate(g), ref))


# ------------------------------------------------------------------ 3. Neural ODE
def mlp_field(t, y, params):
    h = y
    for W, b in params[:-1]:
        h = jnp.tanh(h @ W + b)
    W, b = params[-1]
    return h @ W + b


def mlp_params(widths, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(widths) - 1)
    return [(jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros(b))
            for k, a, b in zip(keys, widths[:-1], widths[1:])]


def interleaved(fns, args, rounds=7, rotate=False):
    """Median and (min, max) seconds of each function, the calls interleaved.

    rotate: start each round with the next function (no function always follows the
    same one: a heavy, multi-threaded call slows the call right after it)."""
    for f in fns:
        jax.block_until_ready(f(*args))
    times = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns)))
        if rotate:
            order = order[r % len(fns):] + order[:r % len(fns)]
        for i in order:
            t = time.perf_counter()
            jax.block_until_ready(fns[i](*args))
            times[i].append(time.perf_counter() - t)
    return [(float(np.median(ts)), min(ts), max(ts)) for ts in times]


def temp_mib(f, *args):
    mem = jax.jit(f).lower(*args).compile().memory_analysis()
    return getattr(mem, "temp_size_in_bytes", 0) / 2 ** 20 if mem is not None else float("nan")


def neural_ode_bench():
    y0 = jnp.array([1.0, 0.5, -0.5, 0.2])
    te = jnp.linspace(0.5, 10.0, 20)
    for widths in ([4, 32, 4], [4, 48, 48, 4], [4, 170, 170, 4]):
        params = mlp_params(widths)
        P = sum(W.size + b.size for W, b in params)
        print(f"Neural ODE, MLP {'-'.join(map(str, widths))} (P = {P}), RK45/Tsit5, "
              f"rtol=atol=1e-7, 20 outputs", flush=True)

        def ours(ps):
            return jnp.sum(solve_ivp(mlp_field, (0.0, 10.0), y0, "RK45", te, args=(ps,),
                                     rtol=1e-7, atol=1e-7).y ** 2)

        def theirs(ps, solver=None, rtol=1e-7):
            sol = diffrax.diffeqsolve(
                diffrax.ODETerm(mlp_field), solver or diffrax.Tsit5(), 0.0, 10.0, None, y0,
                args=ps, saveat=diffrax.SaveAt(ts=te), max_steps=100_000,
                adjoint=diffrax.RecursiveCheckpointAdjoint(),
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=rtol))
            return jnp.sum(sol.ys ** 2)

        ref = jax.jit(jax.grad(lambda ps: theirs(ps, diffrax.Dopri8(), 1e-12)))(params)
        f_ours, f_theirs = jax.jit(jax.value_and_grad(ours)), jax.jit(jax.value_and_grad(theirs))
        (mo, lo_o, hi_o), (md, lo_d, hi_d) = interleaved([f_ours, f_theirs], (params,))
        e_o = rel_err(ravel(f_ours(params)[1]), ravel(ref))
        e_d = rel_err(ravel(f_theirs(params)[1]), ravel(ref))
        mem_o, mem_d = temp_mib(jax.value_and_grad(ours), params), \
            temp_mib(jax.value_and_grad(theirs), params)
        steps = int(solve_ivp(mlp_field, (0.0, 10.0), y0, "RK45", te, args=(params,),
                              rtol=1e-7, atol=1e-7).nfev) // 6
        row(f"Neural ODE P={P}", f"jaxbridge RK45 discrete adjoint (~{steps} steps), "
            f"{mem_o:.2f} MiB temp, range {lo_o * 1e3:.2f}-{hi_o * 1e3:.2f} ms", mo, e_o)
        row(f"Neural ODE P={P}", f"diffrax Tsit5 RecursiveCheckpoint, {mem_d:.2f} MiB temp, "
            f"range {lo_d * 1e3:.2f}-{hi_d * 1e3:.2f} ms", md, e_d)
        print(f"  ratio ours/diffrax: {mo / md:.2f}x (median)", flush=True)


def deq_bench(rounds=15):
    """DEQ value+grad: ours and optimistix, interleaved, against a tight jnp twin.

    optimistix's ImplicitAdjoint defaults to AutoLinearSolver, which materializes the
    n x n Jacobian and factorizes it (16,384 unknowns at 64 x 256: a 2 GiB matrix, not
    run); its matrix-free configuration, ImplicitAdjoint(lineax.GMRES), is the faster
    one and the peer. "Equal accuracy": ours at tol 1e-12 has the smaller gradient error.
    """
    from jaxbridge.scipy.optimize import root
    for batch, width in ((16, 32), (64, 256)):
        print(f"DEQ z = tanh(W z + U x), batch {batch} x width {width} "
              f"({batch * width} unknowns), value+grad in W and U", flush=True)
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
        W = jax.random.normal(k1, (width, width)) * 0.5 / np.sqrt(width)
        U = jax.random.normal(k2, (width, width)) / np.sqrt(width)
        x = jax.random.normal(k3, (batch, width))
        z0 = jnp.zeros((batch, width))

        def twin(W, U):
            z = jax.lax.fori_loop(0, 300, lambda i, z: jnp.tanh(z @ W.T + x @ U.T), z0)
            return jnp.sum(jnp.sin(z))
        ref = ravel(jax.jit(jax.grad(twin, argnums=(0, 1)))(W, U))
        fns, names = [], []
        for method, tol, stepping, on_failure in (
                ("df-sane", 1e-10, "auto", "raise"), ("df-sane", 1e-12, "auto", "raise"),
                ("df-sane", 1e-12, "auto", "nan"), ("df-sane", 1e-10, "scipy", "raise"),
                ("krylov", 1e-10, "auto", "raise"), ("krylov", None, "auto", "raise"),
                ("krylov", 1e-10, "scipy", "raise")):
            def ours(W, U, method=method, tol=tol, stepping=stepping, on_failure=on_failure):
                return jnp.sum(jnp.sin(root(lambda z, W, U: z - jnp.tanh(z @ W.T + x @ U.T),
                                            z0, (W, U), method=method, tol=tol,
                                            stepping=stepping, on_failure=on_failure).x))
            fns.append(jax.jit(jax.value_and_grad(ours, argnums=(0, 1))))
            how = {"auto": "compiled (default)", "scipy": "SciPy's loop"}[stepping]
            names.append(f"jaxbridge root {method} {how} tol={tol}"
                         + (" on_failure='nan' (no host call)" if on_failure == "nan" else ""))
        n_ours = len(fns)
        if optimistix is not None:
            adjoints = [("ImplicitAdjoint(GMRES)",
                         optimistix.ImplicitAdjoint(lineax.GMRES(1e-10, 1e-10)))]
            if batch * width <= 1024:
                adjoints.append(("ImplicitAdjoint() default, dense LU",
                                 optimistix.ImplicitAdjoint()))
            for aname, adj in adjoints:
                def fp(W, U, adj=adj):
                    sol = optimistix.fixed_point(
                        lambda z, a: jnp.tanh(z @ a[0].T + x @ a[1].T),
                        optimistix.FixedPointIteration(1e-10, 1e-10), z0, args=(W, U),
                        max_steps=10_000, adjoint=adj)
                    return jnp.sum(jnp.sin(sol.value))

                def nt(W, U, adj=adj):
                    sol = optimistix.root_find(
                        lambda z, a: z - jnp.tanh(z @ a[0].T + x @ a[1].T),
                        optimistix.Newton(1e-10, 1e-10,
                                          linear_solver=lineax.GMRES(1e-10, 1e-10)),
                        z0, args=(W, U), max_steps=100, adjoint=adj)
                    return jnp.sum(jnp.sin(sol.value))
                fns += [jax.jit(jax.value_and_grad(fp, argnums=(0, 1))),
                        jax.jit(jax.value_and_grad(nt, argnums=(0, 1)))]
                names += [f"optimistix fixed_point FixedPointIteration, {aname}",
                          f"optimistix root_find Newton+GMRES, {aname}"]
        # the dense-LU rows are timed on their own: a heavy multi-threaded call disturbs
        # the calls interleaved with it
        dense = [i for i, name in enumerate(names) if "dense LU" in name]
        light = [i for i in range(len(fns)) if i not in dense]
        stats = [None] * len(fns)
        for group, n in ((light, rounds), (dense, 5)):
            if not group:
                continue
            for i, st in zip(group, interleaved([fns[i] for i in group], (W, U), rounds=n,
                                                rotate=True)):
                stats[i] = st
        errs = [rel_err(ravel(f(W, U)[1]), ref) for f in fns]
        for name, (med, lo, hi), err in zip(names, stats, errs):
            row(f"DEQ {batch}x{width}", f"{name}, range {lo * 1e3:.2f}-{hi * 1e3:.2f} ms", med,
                err)
        if len(fns) > n_ours:
            peer = min(range(n_ours, len(fns)), key=lambda i: stats[i][0])
            print(f"  peer (the faster optimistix configuration): {names[peer]}")
            for i in range(n_ours):
                print(f"  ratio {names[i]} / {names[peer]}: {stats[i][0] / stats[peer][0]:.2f}x"
                      f" median, {stats[i][1] / stats[peer][1]:.2f}x fastest run (gradient "
                      f"error {errs[i]:.1e} vs {errs[peer]:.1e})", flush=True)


def ravel(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


# ------------------------------------------------------------------ 4. Poisson
def poisson_bench(m=316):
    n = m * m
    print(f"2-D Poisson, 5-point stencil, n = {n} unknowns, d/d(b, nonzeros)", flush=True)
    idx = np.arange(n).reshape(m, m)
    rows, cols, vals = [idx.ravel()], [idx.ravel()], [np.full(n, 4.0)]
    for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        src = idx[max(0, -di):m - max(0, di), max(0, -dj):m - max(0, dj)]
        dst = idx[max(0, di):m - max(0, -di) or None, max(0, dj):m - max(0, -dj) or None]
        rows.append(src.ravel())
        cols.append(dst.ravel())
        vals.append(np.full(src.size, -1.0))
    row_, col_ = jnp.asarray(np.concatenate(rows), jnp.int32), jnp.asarray(np.concatenate(cols),
                                                                         jnp.int32)
    data = jnp.asarray(np.concatenate(vals))
    b = jnp.asarray(np.random.default_rng(0).normal(size=n))
    wts = jnp.asarray(np.random.default_rng(1).normal(size=n))

    def ours(d, b):
        return jnp.vdot(wts, spsolve((d, (row_, col_)), b))

    s, (v_ours, (gd, gb_ours)) = bench(jax.jit(jax.value_and_grad(ours, (0, 1))), data, b,
                                       repeat=2)
    # accuracy of our gradient w.r.t. b: residual of the adjoint system A^T lam = w

    def matvec(x):
        x2 = x.reshape(m, m)
        y = 4 * x2
        y = y.at[1:, :].add(-x2[:-1, :]).at[:-1, :].add(-x2[1:, :])
        y = y.at[:, 1:].add(-x2[:, :-1]).at[:, :-1].add(-x2[:, 1:])
        return y.ravel()

    def resid(lam, rhs):
        return float(jnp.linalg.norm(matvec(lam) - rhs) / jnp.linalg.norm(rhs))

    row("Poisson 1e5", "jaxbridge spsolve (SuperLU, grad b + nonzeros)", s,
        f"adjoint residual {resid(gb_ours, wts):.1e}")
    for tol in (1e-8, 1e-10):
        def cg_loss(b, tol=tol):
            x, _ = jax.scipy.sparse.linalg.cg(matvec, b, tol=tol, maxiter=20000)
            return jnp.vdot(wts, x)
        s, (v, gb) = bench(jax.jit(jax.value_and_grad(cg_loss)), b, repeat=2)
        row("Poisson 1e5", f"jax.scipy cg tol={tol:g} (grad b only)", s,
            f"adjoint residual {resid(gb, wts):.1e}; vs ours {rel_err(gb, gb_ours):.1e}")


# ------------------------------------------------------------------ 3b. stiff, many parameters
def stiff_mlp_bench(rounds=5):
    """A stiff neural ODE: y' = -diag(lam) y + MLP(y), lam up to 1e3 (n = 4), P ~ 300 and
    3,000: ours (LSODA / BDF + the compiled adjoint over SciPy's steps) vs diffrax
    Kvaerno5 + RecursiveCheckpointAdjoint, rtol 1e-6, 10 outputs over [0, 5]; interleaved
    repeats (median, range). Gradient error against ours with Radau at rtol 1e-11."""
    print("Stiff neural ODE, y' = -diag(1e3, 1e2, 1, 1e-1) y + MLP(y), t in [0, 5]",
          flush=True)
    lam = jnp.array([1e3, 1e2, 1.0, 0.1])
    y0 = jnp.array([1.0, 0.5, -0.5, 0.2])
    te = jnp.linspace(0.5, 5.0, 10)

    def field(t, y, params):
        return -lam * y + mlp_field(t, y, params)

    for widths in ((4, 32, 4), (4, 64, 32, 4)):
        params = mlp_params(widths, seed=1)
        P = sum(W.size + b.size for W, b in params)

        def ours(params, method="LSODA", rtol=1e-6, atol=1e-9):
            sol = solve_ivp(field, (0.0, 5.0), y0, method, te, args=(params,), rtol=rtol,
                            atol=atol, sensitivity="adjoint")
            return jnp.sum(sol.y ** 2)

        fns = [jax.jit(jax.value_and_grad(lambda p, m=m: ours(p, m))) for m in ("LSODA", "BDF")]
        names = ["jaxbridge LSODA adjoint (compiled)", "jaxbridge BDF adjoint (compiled)"]
        if diffrax is not None:
            def dl(params):
                sol = diffrax.diffeqsolve(
                    diffrax.ODETerm(field), diffrax.Kvaerno5(), 0.0, 5.0, 1e-3, y0, args=params,
                    saveat=diffrax.SaveAt(ts=te),
                    stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-9))
                return jnp.sum(sol.ys ** 2)
            fns.append(jax.jit(jax.value_and_grad(dl)))
            names.append("diffrax Kvaerno5")
        ref = jax.jit(jax.grad(lambda p: ours(p, "Radau", 1e-11, 1e-13)))(params)
        stats = interleaved(fns, (params,), rounds=rounds)
        for name, f, (med, lo, hi) in zip(names, fns, stats):
            g = f(params)[1]
            err = rel_err(ravel(g), ravel(ref))
            print(f"  P={P:6d} {name:40s} {med * 1e3:8.1f} ms ({lo * 1e3:.1f}-{hi * 1e3:.1f})"
                  f"   grad rel. error {err:.1e}", flush=True)
            row(f"stiff MLP P={P}", f"{name}, range {lo * 1e3:.1f}-{hi * 1e3:.1f} ms", med,
                err)


def main():
    t0 = time.time()
    import platform

    import scipy
    print(f"{time.strftime('%Y-%m-%d')}, {platform.machine()} ({platform.processor() or '?'}), "
          f"Python {platform.python_version()}, jax {jax.__version__}, scipy {scipy.__version__}, "
          f"numpy {np.__version__}, diffrax {getattr(diffrax, '__version__', 'not installed')}, "
          f"device {jax.devices()[0].platform}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"sections to run (default: all): {' '.join(SECTIONS)}")
    add_json_option(parser)
    args = parser.parse_args()
    only = set(args.sections)
    if only - set(SECTIONS):
        parser.error(f"unknown sections {sorted(only - set(SECTIONS))}; known: {list(SECTIONS)}")
    global SECTION
    for name, bench_fn in (("robertson", robertson_bench), ("lotka", lotka_bench),
                           ("neural_ode", neural_ode_bench), ("stiff_mlp", stiff_mlp_bench),
                           ("deq", deq_bench),
                           ("poisson", poisson_bench)):
        if not only or name in only:
            if name == "neural_ode" and diffrax is None:
                continue
            title, method = SECTIONS[name]
            SECTION = Table(name, title, "ms per value+grad", COLUMNS, method=method,
                            packages=("diffrax", "optimistix", "lineax", "equinox"))
            bench_fn()
            SECTION.save(args.json)
    print("\n| problem | solver | value+grad (ms, median) | gradient error |")
    print("|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(x.strip() for x in r) + " |")
    print(f"\ntotal {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
