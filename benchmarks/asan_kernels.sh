#!/usr/bin/env bash
# Build the pure-math CPU kernels (csrc/kernels/cpu_kernels.h) with their driver
# tests/native/asan_driver.cc under AddressSanitizer + UndefinedBehaviorSanitizer and
# run it. No XLA, no Python.
#   benchmarks/asan_kernels.sh            (CXX=clang++ to use clang)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${TMPDIR:-/tmp}/jaxbridge-asan-$$"
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
"${CXX:-c++}" -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=undefined -I"$root/csrc/kernels" \
  "$root/tests/native/asan_driver.cc" -o "$out/asan_driver"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$out/asan_driver"
