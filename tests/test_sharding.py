"""Foreign functions on sharded arrays: one call per shard, no gather (8 CPU devices,
in a subprocess because the device count is fixed when JAX starts)."""

import os
import pathlib
import subprocess
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"


def run_script(name: str, timeout: int = 600) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(SCRIPTS / name)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_host_calls_run_once_per_shard_without_gathering():
    assert "sharded host calls OK" in run_script("sharded_host_calls.py")


def test_explicit_mesh_keeps_the_batch_sharding_in_every_composition():
    # f(x) + 1, sum(f(x)**2), its grad, scan, vmap and shard_map, for a host function
    # and a kernel: values right, results typed sharded, no all-gather in the HLO.
    assert "explicit mesh composition OK" in run_script("explicit_mesh_composition.py")
