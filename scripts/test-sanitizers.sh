#!/usr/bin/env bash
# Builds ringfence with a sanitizer preset (CMakePresets.json) and runs the unit, multi-process
# and sanitizer-canary tests under it; any sanitizer report fails the run (docs/sanitizers.md).
#   scripts/test-sanitizers.sh asan|tsan [extra CMake configure arguments]
# JOBS sets the build and ctest parallelism (default: nproc and 2, as scripts/test.sh); CTEST_ARGS
# adds ctest arguments (e.g. CTEST_ARGS="-L unit"); TEST_PRESET picks another test preset of the
# same build (CI: asan-ci, the asan tests less the fault matrix, which the default stage runs).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-}
case "$preset" in
  asan|tsan) shift ;;
  *) echo "usage: scripts/test-sanitizers.sh asan|tsan [cmake configure args]" >&2; exit 2 ;;
esac
start=$SECONDS
cmake --preset "$preset" -DRINGFENCE_WERROR=ON "$@"
cmake --build --preset "$preset" -j "${JOBS:-$(nproc)}"
built=$SECONDS
# shellcheck disable=SC2086  # CTEST_ARGS is a list of words
ctest --preset "${TEST_PRESET:-$preset}" -j "${JOBS:-2}" ${CTEST_ARGS:-}
echo "test-sanitizers ${TEST_PRESET:-$preset}: build $((built - start)) s, tests $((SECONDS - built)) s"
