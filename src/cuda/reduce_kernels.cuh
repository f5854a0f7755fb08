#pragma once
// Reduction kernels for device memory, built from the same host/device functors the CPU engine
// uses (include/ringfence/reduce_ops.hpp: SumOp, ProdOp, MinOp, MaxOp, SumDivOp) and the same
// vectorised loop (`reduce_vec16`: 16-byte loads and stores, scalar head and tail), so the
// arithmetic and the indexing are unit-tested on the CPU (tests/unit/reduce_ops_test.cpp) and
// compared bit for bit with the host kernels on a GPU (tests/gpu/reduce_functors_gpu_test.cu).
// nvcc only: this header is included by .cu files, never by public headers.
#include <cuda_runtime.h>

#include <ringfence/reduce_ops.hpp>
#include <ringfence/types.hpp>

namespace ringfence::cuda {

/// `dst[i] = op(a[i], b[i])`, one grid-stride share per thread.
template <class T, class Op>
__global__ void __launch_bounds__(256) reduce_kernel(T* dst, const T* a, const T* b, std::size_t n, Op op) {
  reduce_vec16(dst, a, b, n, op, blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
               static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

/// Blocks for `n` elements of `elem` bytes: one 16-byte pack per thread, 256 threads per block,
/// at most `max_blocks` (the grid-stride loop covers the rest).
inline unsigned reduce_blocks(std::size_t n, std::size_t elem, unsigned max_blocks = 1024) {
  const std::size_t packs = (n * elem + 15) / 16;
  const std::size_t blocks = (packs + 255) / 256;
  return blocks == 0 ? 1u : blocks > max_blocks ? max_blocks : static_cast<unsigned>(blocks);
}

/// Enqueues `dst = a op b` over `n` elements of `type` on `stream` (avg: `finish` selects the
/// final division by `divisor`, else a plain sum). `dst` may equal `a` or `b`. Returns the
/// launch's error (cudaErrorInvalidValue for out-of-range enumerators). Defined in
/// reduce_kernels.cu for every (type, op).
cudaError_t launch_combine(DataType type, ReduceOp op, bool finish, int divisor, void* dst, const void* a, const void* b,
                           std::size_t n, cudaStream_t stream);

/// Loads every kernel `launch_combine` may launch into the current device's context now
/// (`cudaFuncGetAttributes` on each). With CUDA's lazy loading (the default since CUDA 12.2)
/// a kernel is otherwise loaded at its first launch, and loading may synchronise the whole
/// context: a launch from the engine's thread then waits for a user stream that our own host
/// function holds until the collective ends, which needs that launch (docs/device.md "Kernel
/// loading"). Cheap once loaded. Returns the first error.
cudaError_t preload_kernels();

}  // namespace ringfence::cuda
