#pragma once
// The device reduction kernels, seen from the library: ringfence links no CUDA library, so its
// kernels live in a module of their own, libringfence_kernels.so (src/cuda/kernel_module.cu,
// built by nvcc wherever it works, linked to the shared CUDA runtime), loaded with dlopen like
// the runtime itself. Its C entry points enqueue work on a stream of the runtime the process
// already loaded (the module's libcudart.so.13 dependency resolves to it by soname). On CPU-only
// machines tests load a fake module (tests/device/fake_kernels.cpp) that runs the same host
// functors in stream order over the fake runtime.
#include <cstddef>
#include <string>

#include <ringfence/types.hpp>

namespace ringfence::detail {

/// Version of the module's C interface this library speaks (`ringfence_kernels_abi_version`).
inline constexpr int kKernelsAbiVersion = 2;
/// File name of the module.
inline constexpr const char* kKernelsLibrary = "libringfence_kernels.so";

/// The loaded module. `usable` is false when no module was found or it lacks an entry point or
/// speaks another version; `why_not` then says which.
struct DeviceKernels {
  /// `ringfence_kernels_combine(type, op, finish, divisor, dst, a, b, n, stream)`: enqueues
  /// `dst = a op b` over `n` elements of `type` (DataType) on `stream` (avg: `finish` != 0
  /// divides the sum by `divisor`); `dst` may equal `a` or `b`. Returns a cudaError_t
  /// (0: enqueued; 1, cudaErrorInvalidValue, for out-of-range arguments).
  int (*combine)(int type, int op, int finish, int divisor, void* dst, const void* a, const void* b, std::size_t n,
                 void* stream) = nullptr;
  /// `ringfence_kernels_preload()`: loads every kernel `combine` may launch into the calling
  /// thread's current device context. CUDA loads a kernel lazily at its first launch by default,
  /// and loading may wait for the whole context, including a user stream our host function
  /// holds until the collective ends: so the kernels are loaded before any such function exists
  /// (communicator setup, lane build; docs/device.md "Kernel loading"). Cheap once loaded.
  /// Returns a cudaError_t.
  int (*preload)() = nullptr;
  bool usable = false;
  std::string why_not;
  std::string library;  ///< the file dlopen found

  /// Enqueues `dst = a op b` (`finish`: the final step of an average) on `stream`.
  int launch(DataType type, ReduceOp op, bool finish, int divisor, void* dst, const void* a, const void* b, std::size_t n,
             void* stream) const noexcept {
    return combine(static_cast<int>(type), static_cast<int>(op), finish ? 1 : 0, divisor, dst, a, b, n, stream);
  }
};

/// Loads the kernel module: `path` when not empty, else libringfence_kernels.so from the folder
/// of the binary holding this function (the library, or a program linked to it statically) and
/// its `../lib` folder, then through the usual loader search. Never throws; never unloaded.
DeviceKernels load_device_kernels(const std::string& path);

}  // namespace ringfence::detail
