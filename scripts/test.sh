#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (what CI runs); then builds with
# each preset in SANITIZERS (default: asan = ASan + UBSan) and runs the unit and multi-process
# tests under it (scripts/test-sanitizers.sh, docs/sanitizers.md; asan runs the asan-ci test
# preset: every asan test but the fault matrix, which the default stage ran). SANITIZERS=""
# skips that stage; SANITIZERS="asan tsan" adds TSan. Extra arguments go to the main build's
# configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DRINGFENCE_WERROR=ON "$@"
(cd build && ctest --output-on-failure --timeout 600 -j "${JOBS:-2}")
for preset in ${SANITIZERS-asan}; do
  if [ "$preset" = asan ]; then TEST_PRESET=asan-ci scripts/test-sanitizers.sh asan; else scripts/test-sanitizers.sh "$preset"; fi
done
