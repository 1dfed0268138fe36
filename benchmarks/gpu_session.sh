#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in as few device calls as possible.
#
#   bash benchmarks/gpu_session.sh [PHASE ...]      (default: build gpu-tests torch-gpu bench)
#
# Phases:
#   build        pip install --no-build-isolation --no-deps .  (CUDA kernels compiled)
#   gpu-tests    pytest -m gpu: CUDA kernels vs CPU kernels (values, vjp, jvp, vmap),
#                host calls from GPU programs, bad input and empty input on the GPU
#   torch-gpu    jaxbridge.torch's device path (DLPack views of XLA's device buffers,
#                XLA's stream): tests/test_torch_device.py -m gpu; it skips, saying so,
#                where torch is a CPU build (the summary line prints torch's CUDA)
#   tests        the whole test suite with the GPU as JAX's default device (8 workers; the
#                tests marked `cpu` pin the CPU: CPU-only kernels, SciPy's exact arithmetic)
#   bench        benchmarks/kernels.py and benchmarks/hostcall.py --quick on the GPU
#   bench-quick  the same with kernels.py --quick (fits a short lease)
#   torch-tests  tests/test_torch.py with the GPU as JAX's default device, so that every
#                transform of a wrapped torch function takes the device path where torch
#                has CUDA (XLA_PYTHON_CLIENT_PREALLOCATE=false: one GPU, several workers)
#   torch-bench  benchmarks/torch_bridge.py --quick on the GPU
#   sanitize     gpu-tests under compute-sanitizer memcheck (slow)
#
# Logs go to $OUT (the device tool's output folder) or a temporary folder; the
# summary lines are printed last. The tests run from outside the source tree so
# that they import the installed package (with its compiled modules).
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(build gpu-tests torch-gpu bench)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

run_pytest() {  # run_pytest LOG ARGS...
  local log="$1"; shift
  # The docs tests need sybil and Chromium, which the GPU machines lack; CI runs them.
  (cd /tmp && "$PY" -m pytest -p no:cacheprovider --rootdir="$REPO" -c "$REPO/pyproject.toml" \
      "$REPO/tests" --ignore="$REPO/tests/test_docs.py" --ignore="$REPO/tests/test_docs_site.py" \
      -q -rs "$@") > "$OUT/$log" 2>&1
  local rc=$?
  note "$log: exit $rc: $(tail -1 "$OUT/$log")"
  return $rc
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import jax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, jax.devices())"
} > "$OUT/env.txt" 2>&1
note "env: $(tr '\n' ' ' < "$OUT/env.txt")"

for phase in "${PHASES[@]}"; do
  case "$phase" in
    build)
      (cd "$REPO" && "$PY" -m pip install -v --no-build-isolation --no-deps .) > "$OUT/build.log" 2>&1
      rc=$?
      note "build: exit $rc; $(grep -o 'CUDA support: [A-Z]*' "$OUT/build.log" | head -1)"
      (cd /tmp && "$PY" -c "import jaxbridge as jb, jaxbridge.ops as o; from jaxbridge import _hostcall; \
print('native with_cuda', _hostcall.with_cuda, 'kernel platforms', o._register(), \
'host-call platforms', sorted(jb.info()['native_platforms']))") >> "$SUMMARY" 2>&1
      [ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
      ;;
    gpu-tests) run_pytest gpu_tests.log -m gpu ;;
    torch-gpu)
      note "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1)"
      (cd /tmp && "$PY" -m pytest -p no:cacheprovider --rootdir="$REPO" -c "$REPO/pyproject.toml" \
          "$REPO/tests/test_torch_device.py" -q -rs -m gpu) > "$OUT/torch_gpu.log" 2>&1
      note "torch_gpu.log: exit $?: $(tail -1 "$OUT/torch_gpu.log")"
      ;;
    tests)  # ~3 minutes on 16 cores (an H200 host, 2026-11-26); the preallocation would starve 8 workers
      XLA_PYTHON_CLIENT_PREALLOCATE=false run_pytest tests.log -n 8 -p no:randomly ;;
    torch-tests)
      (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 "$PY" -m pytest -p no:cacheprovider \
          --rootdir="$REPO" -c "$REPO/pyproject.toml" "$REPO/tests/test_torch.py" -q -rs -n 4) \
          > "$OUT/torch_tests.log" 2>&1
      note "torch_tests.log: exit $?: $(tail -1 "$OUT/torch_tests.log")"
      ;;
    torch-bench)
      (cd /tmp && timeout 180 "$PY" "$REPO/benchmarks/torch_bridge.py" --quick --repeats 3) \
          > "$OUT/torch_bench.md" 2>&1
      note "torch_bridge.py: exit $?"
      ;;
    bench|bench-quick)
      quick=(); [ "$phase" = bench-quick ] && quick=(--quick)
      (cd /tmp && "$PY" "$REPO/benchmarks/kernels.py" --dtype both "${quick[@]}") > "$OUT/kernels.md" 2>&1
      note "kernels.py: exit $?"
      (cd /tmp && "$PY" "$REPO/benchmarks/hostcall.py" --quick) > "$OUT/hostcall.md" 2>&1
      note "hostcall.py: exit $?"
      ;;
    sanitize)
      (cd /tmp && compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" -m pytest \
          -p no:cacheprovider --rootdir="$REPO" -c "$REPO/pyproject.toml" "$REPO/tests" -q \
          -m gpu -k "gpu_matches_cpu or extremes or bad_shapes") > "$OUT/sanitize.log" 2>&1
      note "sanitize: exit $? $(grep -c 'Invalid' "$OUT/sanitize.log") invalid accesses"
      ;;
    *) note "unknown phase $phase"; exit 2 ;;
  esac
done

# The device tool brings back at most 8 files: every log goes into one archive beside
# the summary.
(cd "$OUT" && shopt -s nullglob && logs=(*.log *.md env.txt) \
  && tar czf logs.tgz "${logs[@]}" && rm -f "${logs[@]}")
echo "---- summary ($OUT)"
cat "$SUMMARY"
