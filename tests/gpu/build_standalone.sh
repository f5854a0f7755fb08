#!/usr/bin/env bash
# Builds the GPU tests as self-contained binaries (static cudart, no libringfence/libfmt) into
# DIR, so a GPU machine that lacks the build dependencies can run them:
#   tests/gpu/build_standalone.sh build/gpu_out && build/gpu_out/reduce_functors_gpu_test
# Needs nvcc (CUDA >= 12) and g++ here; the binaries need only libstdc++ and the driver there.
set -euo pipefail
out=${1:?usage: build_standalone.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The host kernels exactly as the library builds them (CMakeLists.txt: src/reduce.cpp flags).
g++ -std=c++20 -O3 -march=x86-64-v3 -ffp-contract=off -I"$repo/include" -c "$repo/src/reduce.cpp" -o "$tmp/reduce.o"
g++ -std=c++20 -O2 -I"$repo/include" -c "$repo/src/types.cpp" -o "$tmp/types.o"
"$nvcc" -std=c++20 -O2 -gencode arch=compute_90,code=[sm_90,compute_90] --expt-relaxed-constexpr -I"$repo/include" \
  -I"$repo/src/cuda" -c "$repo/tests/gpu/reduce_functors_gpu_test.cu" -o "$tmp/test.o"
"$nvcc" -std=c++20 -O2 -gencode arch=compute_90,code=[sm_90,compute_90] --expt-relaxed-constexpr -I"$repo/include" \
  -c "$repo/src/cuda/reduce_kernels.cu" -o "$tmp/kernels.o"
"$nvcc" -gencode arch=compute_90,code=[sm_90,compute_90] "$tmp/test.o" "$tmp/kernels.o" "$tmp/reduce.o" "$tmp/types.o" -cudart static \
  -o "$out/reduce_functors_gpu_test"
echo "built $out/reduce_functors_gpu_test"
