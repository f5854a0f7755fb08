#pragma once
/// \file config.hpp
/// Compiler and platform macros shared by every ringfence header. Everything here
/// compiles with a plain host compiler; CUDA-specific spellings appear only when
/// `__CUDACC__` is defined (CUTLASS style), so the same functors serve host and device.

/// Marks a function callable from host and device code. Expands to nothing on a host compiler.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define RINGFENCE_HOST_DEVICE __host__ __device__
#define RINGFENCE_DEVICE __device__
#else
#define RINGFENCE_HOST_DEVICE
#define RINGFENCE_DEVICE
#endif

/// Forces inlining in hot loops (reduction kernels).
#if defined(__GNUC__) || defined(__clang__)
#define RINGFENCE_FORCEINLINE inline __attribute__((always_inline))
#else
#define RINGFENCE_FORCEINLINE inline
#endif

/// Hint for unlikely branches (error paths in the data path).
#define RINGFENCE_UNLIKELY(x) __builtin_expect(!!(x), 0)

/// Debug-only, device-safe assertion. Compiles away with NDEBUG.
#ifdef NDEBUG
#define RINGFENCE_ASSERT(cond) ((void)0)
#else
#include <cassert>
#define RINGFENCE_ASSERT(cond) assert(cond)
#endif
