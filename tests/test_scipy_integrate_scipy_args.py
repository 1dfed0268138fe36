"""solve_ivp, quad, solve_bvp and lfilter take SciPy's arguments as SciPy does (issue #44):
array tolerances, SciPy's solver classes as `method`, `vectorized=True`, a constant
`jac` matrix, and SciPy's exception types for bad input. Every test compares with the
installed SciPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.sparse
from conftest import fd

from jaxbridge.scipy.integrate import solve_ivp

# Two components of very different size, so that a per-component atol changes the steps.
K = jnp.array([1.5, 0.3])
Y0 = jnp.array([1.0, 1e-4])
TE = np.array([0.0, 0.5, 1.0, 2.0])
RTOL = np.array([1e-5, 1e-7])   # the small component is held much tighter
ATOL = np.array([1e-8, 1e-14])
ARRAY_RTOL = ("RK23", "RK45", "DOP853", "LSODA")  # SciPy's Radau and BDF take a float rtol


def rotor(t, y, k):
    """A damped rotation in the plane, coupling the large and the small component."""
    return jnp.array([-k[0] * y[0] + 1e-4 * y[1], -k[1] * y[1] + 1e-4 * jnp.sin(y[0])])


def rotor_np(t, y, k):
    return np.asarray(rotor(t, jnp.asarray(y), jnp.asarray(k)))


# (method, stepping, whether events are passed (SciPy's loop with events))
SLOW = pytest.mark.slow  # (compiling the RK loop and its gradient: ~10-20 s on 2 cores)
PATHS = [pytest.param("RK45", "compiled", False, marks=SLOW),
         ("RK45", "scipy", False), pytest.param("Radau", "compiled", False, marks=SLOW),
         ("BDF", "scipy", False), ("LSODA", "scipy", False),
         pytest.param("RK23", "auto", True, marks=SLOW), ("Radau", "auto", True)]


def _never(t, y, k):
    return y[0] + 10.0


@pytest.mark.parametrize("method,stepping,with_events", PATHS)
def test_array_tolerances_match_scipy_and_differentiate(method, stepping, with_events):
    rtol = RTOL if method in ARRAY_RTOL else 1e-5
    kw = dict(method=method, t_eval=TE, rtol=rtol, atol=ATOL, args=(K,))
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 2.0), np.asarray(Y0), **kw)
    events = {"events": _never} if with_events else {}
    if not with_events:
        kw["stepping"] = stepping
    sol = solve_ivp(rotor, (0.0, 2.0), Y0, **kw, **events)
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-9, atol=1e-14)
    assert int(sol.nfev) == ref.nfev  # SciPy's steps: the per-component tolerances were used
    scalar = scipy.integrate.solve_ivp(rotor_np, (0.0, 2.0), np.asarray(Y0), method=method,
                                       t_eval=TE, rtol=1e-5, atol=1e-8, args=(K,))
    assert not np.array_equal(scalar.y, ref.y)  # (the arrays do change SciPy's steps)

    def loss(k):
        s = solve_ivp(rotor, (0.0, 2.0), Y0, **{**kw, "args": (k,), "rtol": rtol * 1e-2,
                                                 "atol": ATOL * 1e-2}, **events)
        return jnp.sum(s.y[:, -1] * jnp.array([1.0, 1e4]))
    loss = jax.jit(loss)
    np.testing.assert_allclose(jax.grad(loss)(K), fd(loss, K, 1e-6), rtol=1e-3, atol=1e-8)


@pytest.mark.parametrize("bad,what", [(np.array([1e-6, 1e-6, 1e-6]), "wrong shape"),
                                      (np.array([1e-6, -1.0]), "positive")])
def test_bad_array_atol_raises_valueerror_as_scipy(bad, what):
    with pytest.raises(ValueError):
        scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0), atol=bad, args=(K,))
    with pytest.raises(ValueError, match=f"solve_ivp.*atol.*{what}"):
        solve_ivp(rotor, (0.0, 1.0), Y0, t_eval=TE[:2], atol=bad, args=(K,))


@pytest.mark.parametrize("cls", [scipy.integrate.RK45, scipy.integrate.RK23,
                                 scipy.integrate.Radau, scipy.integrate.BDF,
                                 scipy.integrate.LSODA])
def test_scipy_solver_class_as_method(cls):
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 2.0), np.asarray(Y0), method=cls,
                                    t_eval=TE, rtol=1e-8, atol=1e-10, args=(K,))
    sol = solve_ivp(rotor, (0.0, 2.0), Y0, method=cls, t_eval=TE, rtol=1e-8, atol=1e-10,
                    args=(K,), stepping="scipy")
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-10, atol=1e-15)
    assert int(sol.nfev) == ref.nfev
    if cls is not scipy.integrate.RK45:  # (one gradient: the same path as the name's)
        return

    def loss(k):
        return solve_ivp(rotor, (0.0, 2.0), Y0, method=cls, t_eval=TE, rtol=1e-10,
                         atol=1e-12, args=(k,), stepping="scipy").y[0, -1]
    np.testing.assert_allclose(jax.grad(loss)(K), fd(loss, K, 1e-6), rtol=1e-5, atol=1e-9)


def test_user_solver_subclass_as_method_raises_valueerror():
    class MyRK(scipy.integrate.RK45):
        pass
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0), method=MyRK,
                                    args=(K,))
    assert ref.success  # SciPy runs a subclass; its steps are not SciPy's own: refused
    with pytest.raises(ValueError, match=r"solve_ivp: method=.*MyRK: only SciPy's own"):
        solve_ivp(rotor, (0.0, 1.0), Y0, method=MyRK, t_eval=TE[:2], args=(K,))


def decay_columns(t, y, k):
    """Written for SciPy's vectorized=True: y is (n, k), one state per column (called
    with y of shape (n,), `k[:, None] * y` would be an (n, n) outer product)."""
    return -k[:, None] * y + 0.1 * jnp.roll(y, 1, axis=0)


@pytest.mark.parametrize("method,with_events", [("RK45", False), ("Radau", False),
                                                ("RK45", True)])
def test_vectorized_fun_called_as_scipy_does(method, with_events):
    kw = dict(method=method, t_eval=TE, rtol=1e-8, atol=1e-10, args=(K,), vectorized=True)
    ref = scipy.integrate.solve_ivp(
        lambda t, y, k: np.asarray(decay_columns(t, jnp.asarray(y), jnp.asarray(k))),
        (0.0, 2.0), np.asarray(Y0), **kw)
    assert ref.success
    events = {"events": _never} if with_events else {}
    sol = solve_ivp(decay_columns, (0.0, 2.0), Y0, stepping="scipy", **kw, **events)
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-7, atol=1e-12)

    def loss(k):
        return solve_ivp(decay_columns, (0.0, 2.0), Y0, stepping="scipy",
                         **{**kw, "args": (k,)}, **events).y[1, -1]
    np.testing.assert_allclose(jax.grad(loss)(K), fd(loss, K, 1e-6), rtol=1e-5, atol=1e-9)


def test_vectorized_fun_that_also_takes_one_state_gives_the_same_result():
    A = jnp.array([[-1.0, 0.5], [0.0, -2.0]])

    def linear(t, y):  # right for y of shape (n,) and (n, k) alike
        return A @ y
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(A) @ y, (0.0, 1.0), np.asarray(Y0),
                                    t_eval=TE[:3], vectorized=True, rtol=1e-8, atol=1e-10)
    for vec in (True, False):
        sol = solve_ivp(linear, (0.0, 1.0), Y0, t_eval=TE[:3], vectorized=vec, rtol=1e-8,
                        atol=1e-10, stepping="scipy")
        np.testing.assert_allclose(sol.y, ref.y, rtol=1e-10, atol=1e-15)


J_CONST = np.array([[-1.5, 1e-4], [1e-4, -0.3]])  # rotor's Jacobian near y = 0, k = K


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("method,stepping", [("Radau", "auto"), ("BDF", "scipy"),
                                             ("BDF", "auto")])
def test_constant_jac_matrix_as_scipy(method, stepping, sparse):
    jac = scipy.sparse.csc_matrix(J_CONST) if sparse else J_CONST
    kw = dict(method=method, t_eval=TE, rtol=1e-8, atol=1e-11, jac=jac, args=(K,))
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 2.0), np.asarray(Y0), **kw)
    sol = solve_ivp(rotor, (0.0, 2.0), Y0, stepping=stepping, **kw)
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-10, atol=1e-15)
    assert (int(sol.nfev), int(sol.njev)) == (ref.nfev, ref.njev)

    def loss(k):
        return solve_ivp(rotor, (0.0, 2.0), Y0, stepping=stepping,
                         **{**kw, "args": (k,)}).y[0, -1]
    np.testing.assert_allclose(jax.grad(loss)(K), fd(loss, K, 1e-6), rtol=1e-5, atol=1e-9)


PATTERN = np.array([[1, 1], [1, 1]])  # rotor's Jacobian: every entry may be nonzero


@pytest.mark.parametrize("jac", [None, False], ids=["jax_jac", "scipy_differences"])
@pytest.mark.parametrize("method,stepping,extra", [
    ("Radau", "auto", {}), ("BDF", "scipy", {}), ("BDF", "auto", {"dense_output": True})])
def test_jac_sparsity_as_scipy(method, stepping, extra, jac):
    # SciPy's finite differences use the pattern (jac=False); with JAX's exact Jacobian,
    # SciPy's Newton iteration gets it as a sparse matrix, as SciPy's own would be
    pattern = scipy.sparse.csr_matrix(PATTERN)
    kw = dict(method=method, t_eval=TE, rtol=1e-8, atol=1e-11, args=(K,))
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 2.0), np.asarray(Y0), **kw,
                                    jac_sparsity=pattern)
    if extra:
        stepping = "auto"
    sol = solve_ivp(rotor, (0.0, 2.0), Y0, stepping=stepping, jac=jac, jac_sparsity=pattern,
                    **kw, **extra)
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-7, atol=1e-12)
    if jac is False:  # SciPy's own Jacobian: the very same steps
        np.testing.assert_allclose(sol.y, ref.y, rtol=1e-13, atol=1e-16)
        assert int(sol.nfev) == ref.nfev

    def loss(k):
        return solve_ivp(rotor, (0.0, 2.0), Y0, stepping=stepping, jac=jac,
                         jac_sparsity=pattern, **{**kw, "args": (k,)}, **extra).y[0, -1]
    np.testing.assert_allclose(jax.grad(loss)(K), fd(loss, K, 1e-6), rtol=1e-5, atol=1e-9)


def test_jac_sparsity_of_wrong_shape_raises_and_rk_ignores_it_as_scipy():
    bad = np.ones((3, 3))
    with pytest.raises(ValueError):
        scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0), method="BDF",
                                  jac_sparsity=bad, args=(K,))
    with pytest.raises(ValueError, match=r"solve_ivp: `jac_sparsity` .*shape \(2, 2\)"):
        solve_ivp(rotor, (0.0, 1.0), Y0, t_eval=TE[:2], method="BDF", jac_sparsity=bad,
                  args=(K,))
    for method in ("RK45", "LSODA"):  # SciPy: "no effect for a chosen solver", a warning
        with pytest.warns(UserWarning, match="no effect .*jac_sparsity"):
            ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0),
                                            method=method, t_eval=TE[:2], args=(K,),
                                            jac_sparsity=PATTERN)
        with pytest.warns(UserWarning, match="no effect .*jac_sparsity"):
            sol = solve_ivp(rotor, (0.0, 1.0), Y0, method=method, t_eval=TE[:2], args=(K,),
                            jac_sparsity=PATTERN)
        np.testing.assert_allclose(sol.y, ref.y, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("method,jac", [("Radau", np.eye(3)), ("LSODA", J_CONST),
                                        ("LSODA", scipy.sparse.csc_matrix(J_CONST))])
def test_constant_jac_refused_raises_valueerror_as_scipy(method, jac):
    # a wrong shape; LSODA takes a function only (SciPy raises ValueError for a matrix)
    with pytest.raises(ValueError):
        scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0), method=method,
                                  jac=jac, args=(K,))
    with pytest.raises(ValueError, match=r"solve_ivp: .*jac"):
        solve_ivp(rotor, (0.0, 1.0), Y0, t_eval=TE[:2], method=method, jac=jac, args=(K,),
                  stepping="scipy")


def _decay(t, y):
    return -y


def _bvp_f(x, y):
    return jnp.vstack([y[1], -y[0]])


def _bvp_bc(ya, yb):
    return jnp.array([ya[0], yb[0] - 1.0])


def _bvp_f_np(x, y):
    return np.vstack([y[1], -y[0]])


def _bvp_bc_np(ya, yb):
    return np.array([ya[0], yb[0] - 1.0])


def _bvp_fp(x, y, p):
    return jnp.vstack([y[1], -p[0] * y[0]])


def _bvp_bcp(ya, yb, p):
    return jnp.array([ya[0], yb[0], ya[1] - 1.0])


def _bvp_fp_np(x, y, p):
    return np.vstack([y[1], -p[0] * y[0]])


def _bvp_bcp_np(ya, yb, p):
    return np.array([ya[0], yb[0], ya[1] - 1.0])


X5 = np.linspace(0.0, 1.0, 5)
# name -> call(module, which: "scipy" or "ours"); each raises in SciPy
BAD_INPUT = {
    "ivp t_span of 3": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0, 2.0), [1.0], t_eval=[0.5]),
    "ivp unknown method": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0], method="Euler",
                                                   t_eval=[0.5]),
    "ivp t_eval outside": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0], t_eval=[2.0]),
    "ivp t_eval 2-D": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0], t_eval=[[0.5]]),
    "ivp t_eval unsorted": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0],
                                                    t_eval=[0.5, 0.2]),
    "ivp args not a tuple": lambda m, w: m.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), [1.0],
                                                     t_eval=[0.5], args=2.0),
    "ivp negative atol": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0], t_eval=[0.5],
                                                  atol=-1.0),
    "ivp negative first_step": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0],
                                                        t_eval=[0.5], first_step=-1.0),
    "ivp zero max_step": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), [1.0], t_eval=[0.5],
                                                  max_step=0.0),
    "ivp fun of wrong shape": lambda m, w: m.solve_ivp(
        lambda t, y: (jnp if w == "ours" else np).ones(3), (0.0, 1.0), [1.0], t_eval=[0.5]),
    "ivp y0 of strings": lambda m, w: m.solve_ivp(_decay, (0.0, 1.0), ["a"], t_eval=[0.5]),
    "quad limit 0": lambda m, w: m.quad(lambda x: x, 0.0, 1.0, limit=0),
    "quad func returns a vector": lambda m, w: m.quad(
        lambda x: (jnp if w == "ours" else np).array([x, x]), 0.0, 1.0),
    "bvp p 2-D": lambda m, w: m.solve_bvp(
        *((_bvp_fp, _bvp_bcp) if w == "ours" else (_bvp_fp_np, _bvp_bcp_np)), X5,
        np.zeros((2, 5)), p=np.ones((1, 1))),
    "quad unknown weight": lambda m, w: m.quad(lambda x: x, 0.0, 1.0, weight="foo"),
    "bvp x decreasing": lambda m, w: m.solve_bvp(
        *((_bvp_f, _bvp_bc) if w == "ours" else (_bvp_f_np, _bvp_bc_np)), X5[::-1],
        np.zeros((2, 5))),
    "bvp y of wrong shape": lambda m, w: m.solve_bvp(
        *((_bvp_f, _bvp_bc) if w == "ours" else (_bvp_f_np, _bvp_bc_np)), X5,
        np.zeros((2, 4))),
    "bvp x 2-D": lambda m, w: m.solve_bvp(
        *((_bvp_f, _bvp_bc) if w == "ours" else (_bvp_f_np, _bvp_bc_np)), X5[None],
        np.zeros((2, 5))),
    "lfilter a[0] = 0": lambda m, w: m.lfilter([1.0], [0.0, 1.0], np.ones(4)),
    "lfilter zi of wrong shape": lambda m, w: m.lfilter([1.0, 1.0], [1.0], np.ones(4),
                                                        zi=np.ones(3)),
    "lfilter b 2-D": lambda m, w: m.lfilter([[1.0]], [1.0], np.ones(4)),
    "lfilter b empty": lambda m, w: m.lfilter([], [1.0], np.ones(4)),
    "lfilter x scalar": lambda m, w: m.lfilter([1.0], [1.0], 1.0),
    "lfilter axis out of range": lambda m, w: m.lfilter([1.0], [1.0], np.ones(4), axis=3),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_raises_scipys_exception_type(case):
    import scipy.signal

    import jaxbridge.scipy.integrate as ours_integrate
    import jaxbridge.scipy.signal as ours_signal
    signal = case.startswith("lfilter")
    call = BAD_INPUT[case]
    with pytest.raises(Exception) as theirs:
        call(scipy.signal if signal else scipy.integrate, "scipy")
    with pytest.raises(Exception) as ours:
        call(ours_signal if signal else ours_integrate, "ours")
    for kind in (ValueError, TypeError, IndexError, NotImplementedError):
        assert isinstance(ours.value, kind) == isinstance(theirs.value, kind), \
            (case, kind, theirs.value, ours.value)
    assert "jaxbridge" in str(ours.value) or "`x` must be strictly" in str(ours.value) \
        or "limit" in str(ours.value) or "axis" in str(ours.value)


@pytest.mark.parametrize("kw,reason", [
    ({"t_eval": None}, r"t_eval=None returns SciPy's own step times"),
    ({"t_eval": TE[:2], "dense_output": True}, r"dense_output=True: SciPy's own step loop"),
    ({"t_eval": TE[:2], "events": _never}, r"events: SciPy's own step loop")])
def test_compiled_stepping_refusal_names_the_real_reason(kw, reason):
    ref = scipy.integrate.solve_ivp(rotor_np, (0.0, 1.0), np.asarray(Y0), args=(K,),
                                    **{k: v for k, v in kw.items() if k != "events"})
    assert ref.success  # SciPy solves it; only the compiled loop cannot
    with pytest.raises(NotImplementedError, match=reason) as info:
        solve_ivp(rotor, (0.0, 1.0), Y0, args=(K,), stepping="compiled", **kw)
    if "events" not in kw:
        assert "events" not in str(info.value)
