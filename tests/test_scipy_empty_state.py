"""solve_ivp with a zero-size state (issue #44): SciPy returns at once (one step to the
end, `y` of shape (0, len(t))); ours spun forever in the compiled RK loop and failed to
reshape on the events / dense-output path. The solves run in a subprocess with a time
limit, so a hang fails the test instead of stalling the suite."""

import subprocess
import sys

SCRIPT = r'''
import jax, jax.numpy as jnp, numpy as np, scipy.integrate
jax.config.update("jax_enable_x64", True)
from jaxbridge.scipy.integrate import solve_ivp

def compare(method, **kw):
    ours = solve_ivp(lambda t, y: jnp.zeros(0), (0.0, 10.0), jnp.zeros(0), method, **kw)
    ref_kw = {k: v for k, v in kw.items() if k != "stepping"}
    if "events" in ref_kw:
        ref_kw["events"] = lambda t, y: t - 5.0
    ref = scipy.integrate.solve_ivp(lambda t, y: np.zeros(0), (0.0, 10.0), np.zeros(0),
                                    method, **ref_kw)
    assert ref.status == 0 and int(ours.status) == 0, (method, kw, ours.status)
    t, y = np.asarray(ours.t), np.asarray(ours.y)
    if "t_eval" not in kw:  # the step times: padded to max_steps + 1 with inf
        t, y = t[:int(ours.n_points)], y[:, :int(ours.n_points)]
    np.testing.assert_array_equal(t, ref.t, err_msg=f"{method} {kw}")
    assert y.shape == ref.y.shape, (method, kw, y.shape, ref.y.shape)
    assert (int(ours.nfev), int(ours.njev), int(ours.nlu)) == (ref.nfev, ref.njev, ref.nlu), \
        (method, kw, ours.nfev, ours.njev, ours.nlu)
    if kw.get("dense_output"):
        assert ours.sol(5.0).shape == ref.sol(5.0).shape == (0,)
        assert ours.sol(jnp.array([2.0, 7.0])).shape == (0, 2)
    if "events" in kw:
        found = int(ours.n_events[0])  # (padded to max_events)
        np.testing.assert_allclose(np.asarray(ours.t_events[0])[:found], ref.t_events[0])
        assert np.asarray(ours.y_events[0])[:found].shape == ref.y_events[0].shape == (1, 0)

for method in ("Radau", "BDF", "LSODA", "RK23", "RK45", "DOP853"):
    compare(method, t_eval=jnp.array([10.0]))
for method in ("RK45", "BDF"):
    compare(method, t_eval=jnp.array([2.0, 10.0]), stepping="scipy")
    compare(method)
    compare(method, dense_output=True)
    compare(method, t_eval=jnp.array([2.0, 10.0]), dense_output=True)
    compare(method, events=lambda t, y: t - 5.0)

# derivatives through an empty state: zero, at once (compiled RK and BDF paths)
for method in ("RK45", "BDF"):
    f = lambda k: solve_ivp(lambda t, y: -k * y, (0.0, 10.0), jnp.zeros(0), method,
                            t_eval=jnp.array([10.0])).y.sum() + k
    assert float(jax.grad(f)(2.0)) == 1.0 and float(jax.jacfwd(f)(2.0)) == 1.0
print("empty state OK")
'''


def test_zero_size_state_returns_scipys_shapes_at_once():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "empty state OK" in proc.stdout
