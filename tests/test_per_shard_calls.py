"""Host functions running once per shard (4 CPU devices, in subprocesses: the device
count is fixed when JAX starts): host code that calls JAX, exceptions raised in every
shard, and a call that never returns. Each run has a time limit: a hang fails the test
instead of stopping the suite."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PRELUDE = textwrap.dedent("""
    import os, sys, threading, time
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jaxbridge as jb
    jax.config.update("jax_enable_x64", True)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    rows = NamedSharding(mesh, P("d"))
""")


def run(body: str, timeout: float = 120, env: dict | None = None,
        ) -> subprocess.CompletedProcess:
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                                    **(env or {})))


def test_per_shard_host_function_that_calls_jax_jit_does_not_deadlock():
    # Shards of 2 x 1024 deadlocked: each device runs its part of the program on one
    # thread, and the jitted computation inside the host function queued behind it. Also
    # the first call raised a spurious KeptViewError: JAX held the view a moment longer.
    proc = run("""
        inner = jax.jit(lambda a: jnp.sin(a) * 2)

        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            return np.asarray(inner(x))

        x = jax.device_put(jnp.linspace(0, 1, 8 * 1024).reshape(8, 1024), rows)
        step = jax.jit(lambda x: f(x) + 1)
        for i in range(5):
            y = step(x)
            total = jax.jit(jnp.sum)(y)  # a collective queued behind the host calls
            np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(x)) * 2 + 1)
        print("per-shard jit OK", float(total))
    """, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "per-shard jit OK" in proc.stdout
    assert "KeptViewError" not in proc.stderr


def test_per_shard_jax_calls_inside_shard_map_and_value_and_grad():
    proc = run("""
        inner = jax.jit(lambda a: jnp.tanh(a) @ jnp.ones((a.shape[-1], 3)))

        @jb.foreign(lambda x: jax.ShapeDtypeStruct((*x.shape[:-1], 3), x.dtype))
        def f(x):
            return np.asarray(inner(x))

        @f.defvjp
        def f_vjp(primals, y, ct):
            (x,) = primals
            _, pull = jax.vjp(lambda a: jnp.tanh(a) @ jnp.ones((a.shape[-1], 3)), x)
            return (np.asarray(pull(ct)[0]),)

        per_shard = jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
        x = jax.device_put(jnp.linspace(-1, 1, 8 * 512).reshape(8, 512), rows)
        loss = jax.jit(jax.value_and_grad(lambda x: jnp.sum(per_shard(x) ** 2)))
        ref = jax.value_and_grad(
            lambda x: jnp.sum((jnp.tanh(x) @ jnp.ones((512, 3))) ** 2))(np.asarray(x))
        for _ in range(3):
            value, grad = loss(x)
            np.testing.assert_allclose(value, ref[0], rtol=1e-12)
            np.testing.assert_allclose(grad, ref[1], rtol=1e-12)
        print("shard_map value_and_grad OK")
    """, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shard_map value_and_grad OK" in proc.stdout


@pytest.mark.parametrize("exc_type", ["KeyboardInterrupt", "SystemExit"])
def test_keyboard_interrupt_raised_in_every_shard_is_delivered_once(exc_type):
    # All 4 shards raise; the caller's handler runs once, and no second copy arrives
    # inside it (or later, at the next barrier or at exit).
    proc = run(f"""
        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            raise {exc_type}()

        x = jax.device_put(jnp.ones((8, 3)), rows)
        handled = 0
        for attempt in range(3):
            try:
                jax.block_until_ready(jax.jit(f)(x))
            except Exception:  # a retry loop must not swallow it
                print("swallowed by except Exception")
            except {exc_type}:
                handled += 1
                time.sleep(0.3)  # a second copy would arrive here
                jax.effects_barrier()
        jax.effects_barrier()
        print("handled", handled)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "handled 3" in proc.stdout, proc.stdout + proc.stderr
    assert "swallowed" not in proc.stdout
    assert "Exception ignored" not in proc.stderr


def test_a_slower_shards_failure_of_a_reported_run_is_not_raised_again():
    # The shards of one run fail at different times: the first failure is raised at the
    # call site, and the others (still running then) must not arrive as a second
    # exception at the barrier inside the handler. A new run still raises its own.
    proc = run("""
        class ShardError(Exception):
            pass

        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            if x[0, 0] > 0:
                time.sleep(0.5)
            raise ShardError(f"row {int(x[0, 0])}")

        x = jax.device_put(jnp.arange(8.0).reshape(8, 1), rows)
        try:
            jax.block_until_ready(jax.jit(f)(x))
        except ShardError as err:
            print("caught", err)
            jax.effects_barrier()
            print("barrier in the handler OK")
        y = jax.jit(f)(x)  # a new run
        try:
            y.block_until_ready()
        except ShardError as err:
            print("new run raised", err)
        jax.effects_barrier()
        print("done")
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "caught row" in proc.stdout and "barrier in the handler OK" in proc.stdout
    assert "new run raised row" in proc.stdout and "done" in proc.stdout


def test_a_handled_worker_failure_stays_handled():
    # JAX keeps each device's last failed run and raised it again at every barrier, and
    # twice at exit ("Exception ignored in atexit callback").
    proc = run("""
        class ShardError(Exception):
            pass

        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            if x[0, 0] > 5:
                raise ShardError("shard 3 failed")
            return np.asarray(x) * 2

        x = jax.device_put(jnp.arange(8.0).reshape(8, 1), rows)
        try:
            jax.block_until_ready(jax.jit(f)(x))
        except ShardError as err:
            print("caught", err)
        for _ in range(3):
            jax.effects_barrier()
        print("barriers OK")
        print(np.asarray(jax.jit(f)(x[:4] * 0)).tolist())
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "caught shard 3 failed" in proc.stdout and "barriers OK" in proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr


def test_an_unhandled_worker_failure_is_raised_at_the_next_barrier_once():
    # Nothing is lost: a failed run the caller never waited on surfaces at the barrier.
    proc = run("""
        class ShardError(Exception):
            pass

        @jb.foreign(lambda x: x, batch_dims=1)
        def f(x):
            raise ShardError("never waited on")

        y = jax.jit(f)(jax.device_put(jnp.ones((8, 1)), rows))  # no wait
        try:
            jax.effects_barrier()
        except ShardError as err:
            print("barrier raised", err)
        jax.effects_barrier()
        print("second barrier OK")
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "barrier raised never waited on" in proc.stdout
    assert "second barrier OK" in proc.stdout


def test_per_shard_call_that_never_returns_lets_the_process_exit_after_ctrl_c():
    # KeyboardInterrupt reached the main thread, but exit waited for ever on the stuck
    # call (JAX's exit hook waits for every program still running).
    script = PRELUDE + textwrap.dedent("""
        @jb.foreign(lambda x: x, batch_dims=1)
        def stuck(x):
            threading.Event().wait()
            return x

        x = jax.device_put(jnp.ones((8, 3)), rows)
        print("waiting", flush=True)
        jax.block_until_ready(jax.jit(stuck)(x))
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXBRIDGE_SHUTDOWN_TIMEOUT="2")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(1.0)  # the four calls are running
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "KeyboardInterrupt" in err
    assert "4 host function call(s) still running" in err
    assert took < 30, took
