"""jaxbridge.scipy's solvers inside `jax.shard_map` (issue #38): values, `grad` and
`jacfwd` per shard equal to the same program outside the mesh. Each section runs in a
subprocess with 4 forced CPU devices (the device count is fixed when JAX starts) and a
time limit, so a hang fails its test instead of stalling the suite."""

import os
import pathlib
import subprocess
import sys

import pytest

DRIVER = pathlib.Path(__file__).resolve().parent / "scripts" / "scipy_shard_map.py"


def run_section(section: str, *extra: str, timeout: int = 300) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(DRIVER), section, *extra],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{section} shard_map OK" in proc.stdout, proc.stdout


# the compiled RK loop, the compiled stiff derivatives, the host root finder and
# minimizer: raised "Found an unbound axis name" (NameError) before
@pytest.mark.parametrize("section", ["solve_ivp-rk45", "solve_ivp-bdf", "root", "minimize"])
def test_solver_inside_shard_map_matches_outside(section):
    run_section(section)


@pytest.mark.slow
@pytest.mark.parametrize("section", ["solve_ivp-more", "solve_ivp-events", "quad",
                                     "root-compiled", "least_squares", "eigsh", "lfilter"])
def test_more_solvers_inside_shard_map_match_outside(section):
    run_section(section)


@pytest.mark.slow
@pytest.mark.parametrize("section", ["solve_ivp-rk45", "root-compiled"])
def test_one_problem_per_shard_matches_outside(section):
    run_section(section, "per-shard")
