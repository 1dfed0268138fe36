"""Scale-out: data-parallel training on 8 CPU devices, the same run as 2 processes
(jax.distributed, gloo CPU collectives, localhost), and the compiled HLO of host
calls on sharded data. Everything runs in subprocesses: the device count and the
distributed runtime are fixed when JAX starts. Every subprocess has a time limit,
and the launcher kills its workers' process groups on failure."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "data_parallel.py"
SCRIPTS = ROOT / "tests" / "scripts"
STEPS = "12"


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    # The subprocess imports jaxbridge as the test run does (the installed package, or
    # whatever PYTHONPATH names): putting the source tree first would hide the built
    # native extension.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu")
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
        pytest.fail(f"{args} did not finish in {timeout} s:\n{exc.stdout}\n{exc.stderr}")


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict:
    """The example on 8 devices in one process; its loss trajectory."""
    path = tmp_path_factory.mktemp("dp") / "single.json"
    proc = run([str(EXAMPLE), "--steps", STEPS, "--out", str(path)], timeout=120)
    assert proc.returncode == 0, output(proc)
    assert "OK" in proc.stdout.splitlines(), output(proc)
    return {"proc": proc, "path": path, "result": json.loads(path.read_text())}


def test_data_parallel_8_devices(single_process):
    proc, result = single_process["proc"], single_process["result"]
    assert result["devices"] == 8 and result["processes"] == 1
    assert len(result["losses"]) == int(STEPS)
    assert result["losses"][-1] < result["losses"][0]
    assert "FAILED" not in proc.stdout, output(proc)
    # one host call per device per pass, on the shard's rows; all-reduce, no gather
    assert "erf 8, adjoint 8" in proc.stdout, output(proc)
    assert "2 host calls on [16,32] shards" in proc.stdout, output(proc)
    assert "0 all-gather(s)" in proc.stdout, output(proc)


@pytest.mark.slow
def test_two_processes_match_one(single_process, tmp_path):
    """2 processes x 4 devices on localhost: same loss trajectory as 1 process x 8."""
    out = tmp_path / "multi.json"
    t0 = time.monotonic()
    proc = run([str(EXAMPLE), "--launch", "2", "--steps", STEPS, "--timeout", "90",
                "--reference", str(single_process["path"]), "--out", str(out)], timeout=110)
    assert proc.returncode == 0, output(proc)
    assert time.monotonic() - t0 < 110
    assert "OK" in proc.stdout.splitlines(), output(proc)
    # each process ran the host function once per *local* shard
    assert proc.stdout.count("erf 4, adjoint 4 (one per local device: 4)") == 2, output(proc)
    multi = json.loads(out.read_text())["losses"]
    single = single_process["result"]["losses"]
    assert multi == pytest.approx(single, rel=1e-6)


def _pids(stdout: str) -> list[int]:
    line = next(line for line in stdout.splitlines() if line.startswith("launcher: worker pids"))
    return json.loads(line.split("pids", 1)[1])


def _assert_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie would still answer; read its state
        state = pathlib.Path(f"/proc/{pid}/stat")
        assert not state.exists() or state.read_text().split()[2] == "Z", f"worker {pid} alive"


@pytest.mark.slow
def test_launcher_kills_workers_when_one_crashes():
    t0 = time.monotonic()
    proc = run([str(EXAMPLE), "--launch", "2", "--steps", "3", "--timeout", "60",
                "--inject", "crash"], timeout=90)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, output(proc)
    assert "a worker failed" in proc.stdout and "FAILED: worker exit codes" in proc.stdout, \
        output(proc)
    assert elapsed < 45, f"the launcher took {elapsed:.0f} s to give up\n{output(proc)}"
    _assert_gone(_pids(proc.stdout))


@pytest.mark.slow  # waits for the launcher's timeout on purpose
def test_launcher_times_out_and_kills_hung_workers():
    t0 = time.monotonic()
    proc = run([str(EXAMPLE), "--launch", "2", "--steps", "3", "--timeout", "12",
                "--inject", "hang"], timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, output(proc)
    assert "launcher: timed out after 12 s" in proc.stdout, output(proc)
    assert elapsed < 40, f"the launcher took {elapsed:.0f} s\n{output(proc)}"
    _assert_gone(_pids(proc.stdout))


def test_hlo_one_host_call_per_shard_no_gather():
    """jit on 1-D and 2-D meshes, shard_map (full and partial manual): forward and
    gradient compile to one host call per shard on the shard's rows, no all-gather."""
    proc = run([str(SCRIPTS / "distributed_hlo.py")], timeout=120)
    assert proc.returncode == 0, output(proc)
    assert "distributed HLO OK" in proc.stdout, output(proc)
