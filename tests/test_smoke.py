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
