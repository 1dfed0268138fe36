"""Thread budgets inside host calls (jaxbridge/_foreign/threads.py): a call that runs alone
gets the BLAS libraries' own thread count or one thread, whichever its function runs
faster with; calls running at once share the cores; an explicit setting overrides; the
libraries' own settings are back after every call. torch's intra-op threads follow."""

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import jaxbridge as jb
from jaxbridge._foreign import threads

BLAS = [c for c in ThreadpoolController().lib_controllers if c.internal_api == "openblas"]
OWN = BLAS[0].num_threads if BLAS else 0
needs_threads = pytest.mark.skipif(OWN < 2, reason="OpenBLAS runs one thread here: nothing "
                                   "to choose between")


def blas_threads() -> int:
    return BLAS[0].num_threads


@pytest.fixture
def auto():
    threads.use("auto")
    yield
    threads.use(None)


def timed_by_threads(one: float, every: float, seen: list):
    """A host function whose duration depends on its BLAS thread count: `one` seconds
    with one thread, `every` with the library's own count."""
    @jb.foreign(lambda x: x)
    def f(x):
        n = blas_threads()
        seen.append(n)
        time.sleep(one if n == 1 else every)
        return np.asarray(x) + 1

    return f


@needs_threads
@pytest.mark.parametrize("one, every, expect", [
    (0.02, 0.002, OWN), (0.002, 0.02, 1),
    (0.0185, 0.02, 1),  # by 8%: one thread wins however little it wins by
    (0.02, 0.0195, 1)])  # every thread must win by more than 2.5%: a tie goes to one
def test_a_call_that_runs_alone_gets_the_faster_of_every_thread_and_one(auto, one, every,
                                                                          expect):
    seen: list[int] = []
    step = jax.jit(timed_by_threads(one, every, seen))
    for _ in range(15):
        step(jnp.ones(3)).block_until_ready()
    # the first call warms up, the next ten try both, five each
    assert sorted(seen[1:11]) == [1] * 5 + [OWN] * 5, seen
    assert seen[11:] == [expect] * 4, seen
    assert blas_threads() == OWN  # back to the library's own setting


@needs_threads
def test_the_choice_is_tried_again_as_the_load_changes(auto):
    seen: list[int] = []
    durations = {"one": 0.02, "every": 0.002}

    @jb.foreign(lambda x: x)
    def f(x):
        n = blas_threads()
        seen.append(n)
        time.sleep(durations["one"] if n == 1 else durations["every"])
        return np.asarray(x)

    step = jax.jit(f)
    for _ in range(13):  # a warm-up call, ten exploring, two chosen
        step(jnp.ones(3)).block_until_ready()
    assert seen[-2:] == [OWN, OWN]
    durations.update(one=0.002, every=0.03)  # another process took the other cores
    deadline = time.monotonic() + 20
    while seen[-1] != 1 and time.monotonic() < deadline:
        step(jnp.ones(3)).block_until_ready()
    assert seen[-1] == 1, seen[-12:]


@needs_threads
def test_one_probe_that_favours_the_other_choice_does_not_switch(auto):
    """A burst of noise (one thread's calls quicker for one probe's three calls, by less
    than 1.5x) must not send the call to one thread: only probes in a row that agree
    switch, unless one finds the other choice 1.5x faster (the load test above)."""
    seen: list[int] = []
    noisy_calls = {"left": 0}

    @jb.foreign(lambda x: x)
    def f(x):
        n = blas_threads()
        seen.append(n)
        if n == 1 and noisy_calls["left"] == 0 and len(seen) > 11:
            noisy_calls["left"] = 3  # the probe that starts here
        noisy = noisy_calls["left"] > 0
        noisy_calls["left"] -= noisy
        time.sleep(0.0019 if noisy else 0.02 if n == 1 else 0.002)
        return np.asarray(x)

    step = jax.jit(f)
    for _ in range(13):  # a warm-up call, ten exploring, two with every thread
        step(jnp.ones(3)).block_until_ready()
    assert seen[-2:] == [OWN, OWN]
    deadline = time.monotonic() + 20
    while 1 not in seen[11:] and time.monotonic() < deadline:  # the first probe
        step(jnp.ones(3)).block_until_ready()
    probe = seen.index(1, 11)
    for _ in range(8):
        step(jnp.ones(3)).block_until_ready()
    assert seen[probe:probe + 3] == [1, 1, 1], seen[probe:]
    assert seen[probe + 3:] == [OWN] * (len(seen) - probe - 3), seen[probe:]


def test_an_explicit_count_is_used_in_every_call_and_never_raises_the_library():
    seen: list[int] = []
    f = jax.jit(timed_by_threads(0.0, 0.0, seen))
    try:
        threads.use(1)
        for _ in range(3):
            f(jnp.ones(3)).block_until_ready()
        assert seen == [1, 1, 1]
        threads.use(OWN + 4)
        f(jnp.ones(3)).block_until_ready()
        assert seen[-1] == OWN
        threads.use("unlimited")
        f(jnp.ones(3)).block_until_ready()
        assert seen[-1] == OWN
    finally:
        threads.use(None)
    assert blas_threads() == OWN


def test_a_bad_setting_names_the_variable_and_what_it_takes(monkeypatch):
    monkeypatch.setenv("JAXBRIDGE_HOST_BLAS_THREADS", "many")
    with pytest.raises(ValueError, match="JAXBRIDGE_HOST_BLAS_THREADS must be 'auto', a "
                                         "positive integer or 'unlimited', got 'many'"):
        threads.setting()
    for value, expect in (("auto", ("auto", 0)), ("3", ("fixed", 3)),
                          ("unlimited", ("leave", 0)), ("0", ("leave", 0))):
        monkeypatch.setenv("JAXBRIDGE_HOST_BLAS_THREADS", value)
        assert threads.setting() == expect


def test_per_shard_calls_running_at_once_share_the_cores():
    # 4 devices: each shard's call gets max(1, own threads // 4) from its first call on
    # (a program's devices count, not only the calls already running), whatever it
    # would choose alone.
    script = textwrap.dedent("""
        import json, os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from threadpoolctl import ThreadpoolController
        import jaxbridge as jb
        blas = [c for c in ThreadpoolController().lib_controllers
                if c.internal_api == "openblas"][0]
        own, seen = blas.num_threads, []

        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            seen.append(blas.num_threads)
            return np.asarray(x) @ np.eye(x.shape[-1], dtype=x.dtype)

        mesh = Mesh(np.array(jax.devices()), ("d",))
        x = jax.device_put(jnp.ones((8, 64)), NamedSharding(mesh, P("d")))
        for _ in range(3):
            jax.block_until_ready(jax.jit(f)(x))
        print(json.dumps({"own": own, "seen": sorted(set(seen)), "after": blas.num_threads}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["seen"] == [max(1, found["own"] // 4)], found
    assert found["after"] == found["own"]


def test_torch_threads_follow_the_budget_and_are_restored():
    torch = pytest.importorskip("torch")
    import jaxbridge.torch as jt

    seen: list[int] = []
    before = torch.get_num_threads()

    def f(x):
        seen.append(torch.get_num_threads())
        return x + 1

    try:
        threads.use(1)
        jax.jit(jt.wrap(f))(jnp.ones(3)).block_until_ready()
        assert seen[-1] == 1 and torch.get_num_threads() == before
        # A count never raises torch's own setting, and 'unlimited' leaves it alone.
        torch.set_num_threads(1)
        threads.use(2)
        jax.jit(jt.wrap(lambda x: f(x) * 2))(jnp.ones(3)).block_until_ready()
        assert seen[-1] == 1
        torch.set_num_threads(2)
        threads.use("unlimited")
        jax.jit(jt.wrap(lambda x: f(x) * 3))(jnp.ones(3)).block_until_ready()
        assert seen[-1] == 2 and torch.get_num_threads() == 2
    finally:
        threads.use(None)
        torch.set_num_threads(before)

