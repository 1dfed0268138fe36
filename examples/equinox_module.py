"""An Equinox module calling a NumPy function with JVP and VJP rules, inside lax.scan.

`Cell` is a leaky recurrent cell `h' = exp(-rate*dt) * h + gain * nonlin(u + offset)`
whose step runs in NumPy through `jb.foreign`. The module itself is the foreign
function's first argument: its array fields are traced, its static field (`dt`, via
`eqx.field(static=True)`) and its non-array leaves (a NumPy function, a string) are
static. The JVP rule sees `None` for every symbolic-zero tangent: fields that are not
differentiated, and whole arguments. We run the cell under `eqx.filter_jit` +
`lax.scan` with `jax.checking_leaks()` on, and check forward mode (`jax.jacfwd` w.r.t.
one argument, `eqx.filter_jvp` w.r.t. several at once) and reverse mode
(`eqx.filter_grad` of a partly frozen module) against JAX autodiff of a jnp twin,
then train the cell. Exits non-zero if a check fails.

Needs: equinox (`pip install -e ".[examples]"`).
"""

import collections
import sys
from collections.abc import Callable

try:
    import equinox as eqx
except ImportError as err:  # the test skips before running us; a user sees why
    print(f"this example needs equinox ({err}); pip install -e '.[examples]'")
    sys.exit(2)

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)

# NumPy nonlinearities with their derivatives (z, f(z)) -> f'(z), and jnp twins.
DERIVATIVE = {np.tanh: lambda z, a: 1.0 - a * a, np.sin: lambda z, a: np.cos(z)}
JNP_TWIN = {np.tanh: jnp.tanh, np.sin: jnp.sin}
# Which tangents the JVP rule saw as symbolic zeros (None), per call pattern.
ZERO_TANGENTS: collections.Counter = collections.Counter()


class Cell(eqx.Module):
    rate: jax.Array                      # differentiated
    gain: jax.Array                      # differentiated
    offset: jax.Array                    # frozen in training (never differentiated)
    dt: float = eqx.field(static=True)   # static: part of the tree structure
    nonlin: Callable = np.tanh           # a function leaf: static for jaxbridge
    name: str = "cell"                   # a string leaf: static for jaxbridge

    def __call__(self, h, u):
        return cell_step(self, h, u)


@jb.foreign(lambda cell, h, u: h)
def cell_step(cell, h, u):
    """One step of the cell, in NumPy: exp(-rate*dt) * h + gain * nonlin(u + offset)."""
    return np.exp(-cell.rate * cell.dt) * h + cell.gain * cell.nonlin(u + cell.offset)


@cell_step.defjvp
def cell_step_jvp(primals, h_new, tangents):
    """Linear in the tangents; every None is a symbolic zero and costs nothing."""
    cell, h, u = primals
    dcell, dh, du = tangents
    names = ("cell", "h", "u")
    none = [n for n, t in zip(names, tangents) if t is None]
    if dcell is not None:
        none += [f"cell.{f}" for f in ("rate", "gain", "offset") if getattr(dcell, f) is None]
        assert dcell.nonlin is None and dcell.name is None  # static leaves: no tangent
    ZERO_TANGENTS[",".join(none) or "-"] += 1

    decay = np.exp(-cell.rate * cell.dt)
    z = u + cell.offset
    a = cell.nonlin(z)
    slope = cell.gain * DERIVATIVE[cell.nonlin](z, a)
    out = np.zeros_like(h_new)
    if dh is not None:
        out += decay * dh
    if du is not None:
        out += slope * du
    if dcell is not None:
        if dcell.rate is not None:
            out -= cell.dt * decay * h * dcell.rate
        if dcell.gain is not None:
            out += a * dcell.gain
        if dcell.offset is not None:
            out += slope * dcell.offset
    return out


@cell_step.defvjp
def cell_step_vjp(primals, h_new, ct):
    """Cotangents in the caller's structure: a Cell for the cell, arrays for h and u."""
    cell, h, u = primals
    decay = np.exp(-cell.rate * cell.dt)
    z = u + cell.offset
    a = cell.nonlin(z)
    g = cell.gain * DERIVATIVE[cell.nonlin](z, a) * ct
    dcell = eqx.tree_at(lambda c: (c.rate, c.gain, c.offset), cell,
                        (-cell.dt * decay * h * ct, a * ct, g))
    return dcell, decay * ct, g


def twin_step(cell, h, u):
    """The same step in jnp, for JAX's own autodiff."""
    nonlin = JNP_TWIN[cell.nonlin]
    return jnp.exp(-cell.rate * cell.dt) * h + cell.gain * nonlin(u + cell.offset)


def rollout(cell, h0, us, step=cell_step):
    """All hidden states over the input sequence `us` (time x features), via lax.scan."""
    def body(h, u):
        h = step(cell, h, u)
        return h, h
    return jax.lax.scan(body, h0, us)[1]


def maxdiff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main() -> int:
    n, steps = 4, 12
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    cell = Cell(rate=jax.random.uniform(keys[0], (n,), jnp.float64, 0.2, 1.0),
                gain=jax.random.normal(keys[1], (n,), jnp.float64),
                offset=0.1 * jax.random.normal(keys[2], (n,), jnp.float64), dt=0.5)
    h0 = jnp.zeros(n)
    us = jax.random.normal(keys[3], (steps, n), jnp.float64)
    print(f"module: {cell.name} with static dt={cell.dt}, nonlin={cell.nonlin.__name__}; "
          f"foreign step: {cell_step!r}")
    errors = {}

    with jax.checking_leaks():
        run = eqx.filter_jit(rollout)
        hs = run(cell, h0, us)
        errors["forward (filter_jit + scan)"] = maxdiff(hs, rollout(cell, h0, us, twin_step))

        # Forward mode w.r.t. one argument: the inputs. The cell's tangent is a
        # symbolic zero, so the rule sees dcell=None.
        jac = eqx.filter_jit(jax.jacfwd(rollout, argnums=2))(cell, h0, us)
        jac_ref = jax.jacfwd(lambda us: rollout(cell, h0, us, twin_step))(us)
        errors["jacfwd w.r.t. inputs"] = maxdiff(jac, jac_ref)

        # Forward mode w.r.t. several at once: the cell's rate and the initial state.
        # gain, offset and the inputs have None tangents -> symbolic zeros in the rule.
        t_cell = Cell(rate=jnp.linspace(0.5, 1.5, n), gain=None, offset=None, dt=cell.dt,
                      nonlin=None, name=None)
        t_h0 = jnp.ones(n)

        @eqx.filter_jit
        def jvp_rate_h0(cell, h0, us, t_cell, t_h0):
            return eqx.filter_jvp(lambda c, h: rollout(c, h, us), (cell, h0), (t_cell, t_h0))

        _, tangent = jvp_rate_h0(cell, h0, us, t_cell, t_h0)
        _, tangent_ref = jax.jvp(
            lambda r, h: rollout(eqx.tree_at(lambda c: c.rate, cell, r), h, us, twin_step),
            (cell.rate, h0), (t_cell.rate, t_h0))
        errors["filter_jvp w.r.t. (cell.rate, h0)"] = maxdiff(tangent, tangent_ref)

        # Reverse mode w.r.t. the module with `offset` frozen (eqx.partition).
        target = jnp.sin(jnp.arange(steps * n, dtype=jnp.float64).reshape(steps, n) / 5)
        spec = jax.tree.map(lambda _: False, cell)
        spec = eqx.tree_at(lambda c: (c.rate, c.gain), spec, replace=(True, True))
        trainable, frozen = eqx.partition(cell, spec)

        def loss(trainable, frozen, h0, us, step=cell_step):
            model = eqx.combine(trainable, frozen)
            return jnp.mean((rollout(model, h0, us, step) - target) ** 2)

        grads = eqx.filter_jit(eqx.filter_grad(loss))(trainable, frozen, h0, us)
        grads_ref = eqx.filter_grad(loss)(trainable, frozen, h0, us, twin_step)
        errors["filter_grad w.r.t. (cell.rate, cell.gain)"] = maxdiff(grads, grads_ref)
        grad_shape_ok = (isinstance(grads, Cell) and grads.offset is None
                         and grads.rate.shape == (n,) and grads.gain.shape == (n,))
        print(f"gradient is a {type(grads).__name__}: rate {grads.rate.shape}, "
              f"gain {grads.gain.shape}, offset {grads.offset} (frozen)")

        # A short training loop: plain gradient descent on the trainable fields.
        @eqx.filter_jit
        def train_step(trainable, frozen):
            value, g = eqx.filter_value_and_grad(loss)(trainable, frozen, h0, us)
            return jax.tree.map(lambda p, d: p - 0.5 * d, trainable, g), value

        first = float(loss(trainable, frozen, h0, us))
        for it in range(201):
            trainable, value = train_step(trainable, frozen)
            if it % 50 == 0:
                print(f"step {it:4d}  loss {float(value):.4e}")
        final = float(loss(trainable, frozen, h0, us))

    for what, err in errors.items():
        print(f"{what:45s} max abs error vs jnp twin: {err:.2e}")
    print("symbolic-zero tangents seen by the JVP rule (None args/fields: calls):")
    for pattern, count in sorted(ZERO_TANGENTS.items()):
        print(f"  {pattern:30s} {count}")
    print(f"training: loss {first:.4e} -> {final:.4e} in 200 filter_jit steps; no leaked tracers")

    expected_patterns = {"cell", "u,cell.gain,cell.offset"}
    ok = (all(err < 1e-12 for err in errors.values()) and grad_shape_ok
          and expected_patterns <= set(ZERO_TANGENTS) and final < 0.9 * first)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
