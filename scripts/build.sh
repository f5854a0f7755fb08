#!/usr/bin/env bash
# Configures and builds ringfence into ./build (ccache + ninja when present).
# Extra arguments go to the CMake configure step, e.g. scripts/build.sh -DRINGFENCE_WERROR=ON
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@"
cmake --build build -j "${JOBS:-$(nproc)}"
