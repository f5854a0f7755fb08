#!/usr/bin/env bash
# Installs everything ringfence needs to build and test on Debian 12 (idempotent; run as root
# or with sudo). CUDA and NCCL are optional and not installed here: the build uses them when
# /usr/local/cuda exists.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libfmt-dev catch2 libbenchmark-dev
  openmpi-bin libopenmpi-dev libgloo-dev
  libibverbs-dev rdma-core
  iproute2 procps
  gnuplot-nox nlohmann-json3-dev python3-prometheus-client
  clang libclang-rt-14-dev
  python3-torch libtorch-dev pybind11-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all packages present"
