// libringfence_kernels.so: the device reduction kernels behind a C interface, loaded by the
// library with dlopen (src/device_kernels.hpp). Linked to the shared CUDA runtime, so its
// libcudart.so.13 dependency resolves to the runtime the process already loaded.
#include "reduce_kernels.cuh"

#define RINGFENCE_KERNELS_EXPORT extern "C" __attribute__((visibility("default")))

RINGFENCE_KERNELS_EXPORT int ringfence_kernels_abi_version() { return 2; }

RINGFENCE_KERNELS_EXPORT int ringfence_kernels_combine(int type, int op, int finish, int divisor, void* dst, const void* a,
                                                       const void* b, std::size_t n, void* stream) {
  using ringfence::DataType;
  using ringfence::ReduceOp;
  if (type < static_cast<int>(DataType::Int8) || type > static_cast<int>(DataType::Float64) || op < static_cast<int>(ReduceOp::Sum) ||
      op > static_cast<int>(ReduceOp::Avg))
    return cudaErrorInvalidValue;
  return ringfence::cuda::launch_combine(static_cast<DataType>(type), static_cast<ReduceOp>(op), finish != 0, divisor, dst, a, b, n,
                                         static_cast<cudaStream_t>(stream));
}

// Loads every kernel into the current device's context (reduce_kernels.cuh, preload_kernels):
// called where no stream of ours is held, never on the data path.
RINGFENCE_KERNELS_EXPORT int ringfence_kernels_preload() { return ringfence::cuda::preload_kernels(); }
