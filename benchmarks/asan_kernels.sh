#!/usr/bin/env bash
# Build under AddressSanitizer + UndefinedBehaviorSanitizer and run, with no XLA and no
# Python at run time:
#  1. the pure-math CPU kernels (csrc/math/cpu_kernels.h) with their driver
#     tests/native/asan_driver.cc;
#  2. the guarded call (csrc/builtin/guard.cc) around the handlers of a kernel with
#     residuals (examples/rms_norm.cc) and of kernels that write outside their outputs
#     (tests/native/kernel_checks.cc), with its driver tests/native/asan_guard.cc (call
#     frames built as XLA builds them; the XLA FFI headers come from jaxlib).
#   benchmarks/asan_kernels.sh            (CXX=clang++ to use clang; PYTHON=the
#                                          interpreter whose jaxlib has the FFI headers)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${TMPDIR:-/tmp}/jaxbridge-asan-$$"
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=undefined)
"${CXX:-c++}" "${flags[@]}" -I"$root/csrc/math" \
  "$root/tests/native/asan_driver.cc" -o "$out/asan_driver"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$out/asan_driver"

ffi_include="$("${PYTHON:-python3}" -c 'import jax.ffi; print(jax.ffi.include_dir())')"
"${CXX:-c++}" "${flags[@]}" -isystem "$ffi_include" -I"$root/csrc/include" \
  -I"$root/csrc/builtin" "$root/tests/native/asan_guard.cc" "$root/csrc/builtin/guard.cc" \
  "$root/examples/rms_norm.cc" "$root/tests/native/kernel_checks.cc" -o "$out/asan_guard"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$out/asan_guard"
