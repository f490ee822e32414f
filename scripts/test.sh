#!/usr/bin/env bash
# Sets up and runs the whole test suite, as CI does:
#   1. GCC Release build (warnings as errors): every test.
#   2. clang ASan+UBSan build: every test.
#   3. clang TSan build: the tests labelled "concurrency".
#   4. pmcheck on every persistent index with a bounded crash-image budget,
#      and the durability lint (zero missing flushes allowed).
#   5. the Python package: pip install ./python into a venv, then pytest.
# Set PMINDEX_TEST_FLAVOURS="release" (etc.) to run a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PMINDEX_TEST=1
flavours=${PMINDEX_TEST_FLAVOURS:-"release asan tsan pmcheck python"}
jobs=$(nproc)
start=$(date +%s)
stamp() { echo "[test.sh +$(( $(date +%s) - start ))s] $*" >&2; }

for f in $flavours; do
  case "$f" in
    release|asan)
      stamp "building $f"
      dir=$(bash scripts/build.sh "$f")
      stamp "testing $f"
      ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 1200
      ;;
    tsan)
      stamp "building tsan"
      dir=$(bash scripts/build.sh tsan concurrency_tests)  # what the concurrency tests need
      stamp "testing tsan (concurrency tests)"
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L concurrency --timeout 1200
      ;;
    pmcheck)
      stamp "pmcheck"
      bash scripts/pmcheck-ci.sh build
      ;;
    python)
      stamp "python package (pip install ./python, pytest)"
      bash scripts/test-python.sh
      ;;
  esac
done
stamp "all test flavours passed: $flavours"
