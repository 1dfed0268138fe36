#!/usr/bin/env bash
# The host-call runtime (jaxbridge._hostcall) built with AddressSanitizer and
# UndefinedBehaviorSanitizer, and its tests run against it: host calls, exception
# delivery, per-shard calls, and the torch bridge's redirect (torch writing into XLA's
# buffers). Python, NumPy, jaxlib and torch are not instrumented; ASan's allocator is
# preloaded, so their heap blocks are tracked and our code's accesses to them checked.
#   benchmarks/asan_hostcall.sh [pytest args...]   (default: the tests named below)
# It makes its own virtual environment and build directory under $TMPDIR (about 6
# minutes to build on 2 cores) and fails on any sanitizer report.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${TMPDIR:-/tmp}/jaxbridge-asan-hostcall"
python="${PYTHON:-python3}"
mkdir -p "$out"
if [ ! -x "$out/venv/bin/python" ]; then
  "$python" -m venv "$out/venv"
fi
# shellcheck disable=SC1091
. "$out/venv/bin/activate"
python -m pip install --quiet --upgrade pip
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
# torch only where the README's torch extra installs it (Python 3.11).
extras="test"
python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' && extras="test,torch"
JAXBRIDGE_CUDA=OFF python -m pip install --quiet \
  -C build-dir="$out/build" -C cmake.build-type=RelWithDebInfo \
  -C "cmake.define.CMAKE_CXX_FLAGS=$flags" \
  -C "cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" \
  "$root[$extras]"
# Run from a copy of the tests, so that the installed (instrumented) package is imported,
# not the source tree.
rm -rf "$out/tests" && cp -r "$root/tests" "$out/tests" && cp "$root/pyproject.toml" "$out/"
cd "$out"
asan="$(${CXX:-c++} -print-file-name=libasan.so)"
ubsan="$(${CXX:-c++} -print-file-name=libubsan.so)"
report="$out/sanitizer"
rm -f "$report".*
# Python and jaxlib keep memory until exit by design: leak reports are off.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$report"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$report"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(tests/test_hostcall.py tests/test_hostcall_runtime.py tests/test_delivery.py
         tests/test_per_shard_calls.py tests/test_torch_redirect.py tests/test_torch.py)
fi
set +e
# The slow tests too (the 16M-element kept-result case is one).
LD_PRELOAD="$asan:$ubsan" python -m pytest -p no:cacheprovider -q -m "not docs" "${tests[@]}"
status=$?
set -e
if compgen -G "$report.*" > /dev/null; then
  echo "sanitizer reports:" && cat "$report".*
  exit 1
fi
echo "no sanitizer reports (pytest exit $status)"
exit $status
