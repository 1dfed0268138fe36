"""Complex inputs to jaxbridge.scipy (issue #44): every solver here is real, so complex
arguments, and user functions that return complex values, raise a ValueError that names
the function and the argument. Before, they were cast to real (the imaginary part
dropped, at most a ComplexWarning) or failed deep inside ("Cannot lower jaxpr")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse

from jaxbridge.scipy import integrate, optimize, signal, special
from jaxbridge.scipy.sparse.linalg import eigsh, spsolve


def decay(t, y):
    return -y


@pytest.mark.parametrize("kw", [dict(t_eval=[1.0]), dict(t_eval=[1.0], method="BDF"),
                                dict(t_eval=[1.0], stepping="scipy"),
                                dict(dense_output=True), dict(events=lambda t, y: t - 0.5)])
def test_solve_ivp_complex_y0_raises_instead_of_dropping_the_imaginary_part(kw):
    # SciPy integrates it: y(1) = 0.184 + 0.368j; the cast gave 0.184
    with pytest.raises(ValueError, match=r"integrate\.solve_ivp: `y0` must be real.*"
                                         r"complex128"):
        integrate.solve_ivp(decay, (0, 1), jnp.array([0.5 + 1j]), **kw)


def test_solve_ivp_fun_returning_complex_raises():
    with pytest.raises(ValueError, match=r"solve_ivp: `fun` must return real values "
                                         r"\(as fun\(t, y, \*args\)\); it returned complex"):
        integrate.solve_ivp(lambda t, y: -1j * y, (0, 1), jnp.array([0.5]), t_eval=[1.0])


def test_solve_ivp_complex_inside_jit_raises_at_trace_time():
    @jax.jit
    def f(y0):
        return integrate.solve_ivp(decay, (0, 1), y0, t_eval=[1.0]).y

    with pytest.raises(ValueError, match="`y0` must be real"):
        f(jnp.array([0.5 + 1j]))


def test_eigsh_hermitian_complex_matrix_raises():
    # SciPy: eigenvalues [4, 5.828]; the cast dropped the imaginary off-diagonal: [4, 5]
    A = np.array([[4.0, 1j, 0.0], [-1j, 4.0, 1.0], [0.0, 1.0, 5.0]])
    for given in (jnp.asarray(A), scipy.sparse.csr_matrix(A)):
        with pytest.raises(ValueError, match=r"sparse\.linalg\.eigsh: `A` must be real"):
            eigsh(given, k=2)


def test_spsolve_complex_matrix_or_right_hand_side_raises():
    A = scipy.sparse.csr_matrix(np.array([[2.0, 1.0], [0.0, 4.0]]))
    with pytest.raises(ValueError, match=r"spsolve: `b` must be real"):
        spsolve(A, jnp.array([1.0 + 1j, 2.0]))
    with pytest.raises(ValueError, match=r"spsolve: `A` must be real"):
        spsolve(A * (1 + 1j), jnp.array([1.0, 2.0]))


@pytest.mark.parametrize("which", ["b", "a", "x", "zi"])
def test_lfilter_complex_argument_raises(which):
    args = dict(b=jnp.array([0.5, 0.5]), a=jnp.array([1.0, -0.3]),
                x=jnp.array([1.0, 0.0, 2.0]), zi=jnp.array([0.1]))
    args[which] = args[which] * (1 + 1j)
    with pytest.raises(ValueError, match=rf"signal\.lfilter: `{which}` must be real"):
        signal.lfilter(args["b"], args["a"], args["x"], zi=args["zi"])


@pytest.mark.parametrize("name, args, which", [
    ("kve", (0, 0.2 + 1j), "x"), ("kv", (0.5j, 1.0), "v"), ("iv", (0, [1.0, 2j]), "x"),
    ("ive", (0, 1j), "x"), ("hyp1f1", (1.0, 2.0 + 0j, 0.5), "b"), ("ellipk", (0.5j,), "m"),
    ("ellipe", (0.5j,), "m"), ("erfcx", (1j,), "x"), ("erfi", (1j,), "x"),
    ("dawsn", (jnp.array([1j]),), "x")])
def test_special_complex_argument_raises(name, args, which):
    # kve(0, 0.2+1j): SciPy 0.97-0.56j; the cast computed kve(0, 0.2)
    with pytest.raises(ValueError, match=rf"special\.{name}: `{which}` must be real"):
        getattr(special, name)(*args)


@pytest.mark.parametrize("solve", [
    lambda x0: optimize.least_squares(lambda x: x - 1.0, x0),
    lambda x0: optimize.minimize(lambda x: jnp.sum((x - 1.0) ** 2), x0),
    lambda x0: optimize.root(lambda x: x - 1.0, x0),
    lambda x0: optimize.root(lambda x: x - 1.0, x0, method="df-sane")])
def test_optimize_complex_x0_raises(solve):
    # SciPy's least_squares: "x0 must be real"
    with pytest.raises(ValueError, match=r"optimize\.\w+: `x0` must be real"):
        solve(jnp.array([1j, 2.0]))


def test_optimize_fun_returning_complex_raises():
    with pytest.raises(ValueError, match=r"least_squares: `fun` must return real values"):
        optimize.least_squares(lambda x: x - 1j, jnp.zeros(1))


def bvp_fun(x, y):
    return jnp.vstack([y[1], -y[0]])


def test_solve_bvp_complex_boundary_condition_raises():
    # before: "Cannot lower jaxpr with verifier errors"
    x = jnp.linspace(0.0, 1.0, 5)
    with pytest.raises(ValueError, match=r"integrate\.solve_bvp: `bc` must return real"):
        integrate.solve_bvp(bvp_fun, lambda ya, yb: jnp.stack([ya[0] - 1j, yb[0]]), x,
                            jnp.zeros((2, 5)))


@pytest.mark.parametrize("which", ["y", "p"])
def test_solve_bvp_complex_guess_raises(which):
    x = jnp.linspace(0.0, 1.0, 5)
    y = jnp.zeros((2, 5)) + (1j if which == "y" else 0)
    p = jnp.array([1j]) if which == "p" else None

    def fun(x, y, *p):
        return jnp.vstack([y[1], -y[0]])

    def bc(ya, yb, *p):
        return jnp.stack([ya[0] - 1.0, yb[0], *([ya[1]] if p else [])])

    with pytest.raises(ValueError, match=rf"solve_bvp: `{which}` must be real"):
        integrate.solve_bvp(fun, bc, x, y, p=p)


def test_quad_complex_integrand_raises():
    with pytest.raises(ValueError, match=r"integrate\.quad: `func` must return real"):
        integrate.quad(lambda x: jnp.exp(1j * x), 0.0, 1.0)
