#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DRINGFENCE_WERROR=ON "$@"
cd build
ctest --output-on-failure --timeout 600 -j "${JOBS:-2}"
