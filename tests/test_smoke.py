"""The package imports, reports its build, and the quickstart example passes."""

import pathlib
import subprocess
import sys

import jaxbridge as jb

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_info_reports_native_extension():
    info = jb.info()
    assert info["jaxbridge"] == jb.__version__
    assert info["native"], info["native_error"]
    assert "cpu" in info["native_platforms"]


def test_quickstart_example_runs():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


def _run(args, cwd, **kw):
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env, **kw)


def test_python_m_jaxbridge_ends_with_one_verdict_line(tmp_path):
    proc = _run(["-m", "jaxbridge"], cwd=tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and last.startswith("OK: jaxbridge"), proc.stdout + proc.stderr


def test_the_repository_root_is_not_a_trap():
    # Python started in the repository root imports the source tree (the current
    # directory comes first on sys.path). With an editable install that tree has the
    # compiled extension; otherwise jaxbridge must say so, with the cause and the fix,
    # instead of silently running host calls through jax.pure_callback.
    code = ("import warnings, jax, jax.numpy as jnp, numpy as np, jaxbridge as jb\n"
            "warnings.simplefilter('always')\n"
            "f = jb.foreign(lambda x: x)(np.sin)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    jax.jit(f)(jnp.ones(2)).block_until_ready()\n"
            "print('native' if jb.info()['native'] else 'no native')\n"
            "print('|'.join(str(x.message) for x in w))\n")
    proc = _run(["-c", code], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    native, warned = proc.stdout.splitlines()[:2]
    verdict = _run(["-m", "jaxbridge"], cwd=ROOT)
    if native == "native":
        assert warned == ""
        assert verdict.returncode == 0 and "OK: jaxbridge" in verdict.stdout
    else:
        assert "source tree" in warned and "pip install -e" in warned, warned
        assert "pure_callback" in warned
        assert verdict.returncode == 1
        last = verdict.stdout.strip().splitlines()[-1]
        assert last.startswith("NOT OK") and "source tree" in last, verdict.stdout
