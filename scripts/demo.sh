#!/usr/bin/env bash
# Installs dependencies, builds, and runs the demo: 4 local ranks doing float32 allreduces
# (bandwidth table + exact check) and printing each rank's per-link table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/bin/ringfence-run -n 4 build/bin/allreduce_demo
