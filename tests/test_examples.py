"""Every example script runs to completion and passes its own checks.

Each example is run as a subprocess (as a user would run it) and must exit 0 and
print its success line, `OK`. Examples that need an optional dependency (the
`examples` extra, `pip install -e ".[examples]"`) are skipped, with the reason, where it is missing.
"""

import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 300

# example -> optional modules it cannot run without (soft dependencies such as
# optax, tqdm or matplotlib in training_loop.py have fallbacks and are not listed).
REQUIRES = {
    "flax_nnx_module.py": ("flax", "optax"),
    "equinox_module.py": ("equinox",),
    "custom_gradient.py": (),
    "projectile_events.py": (),
    "pytree_model.py": (),
    "softplus.py": (),
    "training_loop.py": (),
    "torch_model.py": ("torch", "optax"),
    "neural_ode.py": ("optax", "tqdm"),  # (matplotlib optional: the PNG is skipped)
    "rms_norm.py": (),  # compiles C++ (examples/rms_norm.cc, rms_norm_tutorial.cc)
}


def require(module: str, example: str) -> None:
    """Skip, with the reason, unless `module` imports (like pytest.importorskip, but
    also for an installed module that fails to import, e.g. one too new for jax)."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        extra = "torch" if module == "torch" else "examples"
        pytest.skip(f"{example} needs {module} (pip install -e '.[{extra}]'): {err}")


def run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, str(EXAMPLES / name), *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} did not finish in {TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}")


def check(proc: subprocess.CompletedProcess, name: str) -> None:
    output = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}\n{output}"
    assert "OK" in proc.stdout.splitlines(), f"{name} printed no success line\n{output}"
    assert "FAILED" not in proc.stdout, output


def test_listed_examples_exist():
    missing = [name for name in REQUIRES if not (EXAMPLES / name).is_file()]
    assert not missing, f"listed examples not found in {EXAMPLES}: {missing}"


# Long by nature (an ODE or a torch model trained for several steps): in the slow run;
# for the default run's budget also the pytree and Equinox examples
# (5-6 s each): pytrees and Equinox modules as arguments are covered by unit tests in
# the default run (test_foreign.py, test_scipy_closures.py); Flax NNX's example stays
SLOW_EXAMPLES = {"neural_ode.py", "projectile_events.py", "torch_model.py",
                 "pytree_model.py", "equinox_module.py",
                 # 40 s here (two C++ builds, check_rules, timings); its kernel's values,
                 # derivatives, programs, checker run and guard are in the default run
                 # (test_kernel_residuals.py, test_kernel_guard.py, docs/guides/ffi-tutorial.md)
                 "rms_norm.py"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES
                                  else n for n in sorted(REQUIRES) if n != "training_loop.py"])
def test_example_runs(name):
    for module in REQUIRES[name]:
        require(module, name)
    check(run_example(name), name)


@pytest.mark.slow
def test_training_loop_example(tmp_path):
    """Also: the loss curve goes to --out (when matplotlib is there), not the repo."""
    proc = run_example("training_loop.py", "--out", str(tmp_path), "--steps", "300")
    check(proc, "training_loop.py")
    assert "step time: with host layers" in proc.stdout and "ratio" in proc.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib not installed" in proc.stdout
    else:
        png = tmp_path / "loss_curve.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
