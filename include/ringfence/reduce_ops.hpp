#pragma once
/// \file reduce_ops.hpp
/// Reduction functors shared by the CPU loops and (later) the CUDA kernels, plus the
/// type-erased `Reducer` the engines use so that they work on bytes, not templates.
///
/// Semantics, identical on host and device:
/// - Integer sum/prod wrap modulo 2^bits (two's complement), like NCCL; no UB on overflow.
/// - float16/bfloat16 convert to float, operate, and round once (ties to even).
/// - min/max return the first operand when the operands compare equal or unordered.
/// - avg = sum, then one division by the rank count by the element's owner (integer division
///   truncates toward zero for integer types).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ringfence/config.hpp>
#include <ringfence/half.hpp>
#include <ringfence/types.hpp>
#include <type_traits>

namespace ringfence {

/// Maps a `DataType` to its C++ storage type.
template <DataType T>
struct StorageOf;
template <> struct StorageOf<DataType::Int8> { using type = std::int8_t; };
template <> struct StorageOf<DataType::Uint8> { using type = std::uint8_t; };
template <> struct StorageOf<DataType::Int32> { using type = std::int32_t; };
template <> struct StorageOf<DataType::Uint32> { using type = std::uint32_t; };
template <> struct StorageOf<DataType::Int64> { using type = std::int64_t; };
template <> struct StorageOf<DataType::Uint64> { using type = std::uint64_t; };
template <> struct StorageOf<DataType::Float16> { using type = Half; };
template <> struct StorageOf<DataType::BFloat16> { using type = BFloat16; };
template <> struct StorageOf<DataType::Float32> { using type = float; };
template <> struct StorageOf<DataType::Float64> { using type = double; };

namespace detail {
/// Arithmetic type used to compute on a storage type: float for the 16-bit floats,
/// the unsigned counterpart for integers (wrapping arithmetic), the type itself otherwise.
template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<Half> { using type = float; };
template <> struct ComputeOf<BFloat16> { using type = float; };
template <> struct ComputeOf<std::int8_t> { using type = std::uint32_t; };
template <> struct ComputeOf<std::uint8_t> { using type = std::uint32_t; };
template <> struct ComputeOf<std::int32_t> { using type = std::uint32_t; };
template <> struct ComputeOf<std::int64_t> { using type = std::uint64_t; };

template <class T>
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE auto load(T v) noexcept {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return to_float(v);
  else
    return static_cast<typename ComputeOf<T>::type>(v);
}
template <class T, class C>
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T store(C v) noexcept {
  if constexpr (std::is_same_v<T, Half>)
    return to_half(v);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return to_bfloat16(v);
  else
    return static_cast<T>(v);
}
}  // namespace detail

/// Sum functor: `a + b` with the wrapping/rounding rules above.
template <class T>
struct SumOp {
  RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T operator()(T a, T b) const noexcept {
    return detail::store<T>(detail::load(a) + detail::load(b));
  }
};

/// Product functor.
template <class T>
struct ProdOp {
  RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T operator()(T a, T b) const noexcept {
    return detail::store<T>(detail::load(a) * detail::load(b));
  }
};

/// Minimum functor (compares in the element's own type).
template <class T>
struct MinOp {
  RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T operator()(T a, T b) const noexcept {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return to_float(b) < to_float(a) ? b : a;
    else
      return b < a ? b : a;
  }
};

/// Maximum functor.
template <class T>
struct MaxOp {
  RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T operator()(T a, T b) const noexcept {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return to_float(a) < to_float(b) ? b : a;
    else
      return a < b ? b : a;
  }
};

/// Final step of avg: `(a + b) / divisor`, computed in the compute type and rounded once.
template <class T>
struct SumDivOp {
  int divisor;  ///< number of ranks (> 0)
  RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE T operator()(T a, T b) const noexcept {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> || std::is_floating_point_v<T>) {
      using C = typename detail::ComputeOf<T>::type;
      return detail::store<T>((detail::load(a) + detail::load(b)) / static_cast<C>(divisor));
    } else if constexpr (std::is_signed_v<T>) {
      const T sum = static_cast<T>(detail::load(a) + detail::load(b));  // wraps
      return static_cast<T>(sum / static_cast<T>(divisor));
    } else {
      return static_cast<T>(static_cast<T>(a + b) / static_cast<T>(divisor));
    }
  }
};

/// Applies `op` element-wise: `dst[i] = op(a[i], b[i])` for i < n. `dst` may equal `a` or `b`
/// exactly; any other overlap is undefined. Written so the host compiler vectorises it. Always
/// inlined: src/reduce.cpp compiles it once per CPU variant, and an out-of-line copy would be
/// one weak symbol that the linker could take from the AVX2 variant for every caller.
template <class T, class Op>
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE void reduce_loop(T* dst, const T* a, const T* b, std::size_t n, Op op) noexcept {
  if (dst == b) {
    T* __restrict d = dst;
    const T* __restrict x = a;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(x[i], d[i]);
  } else if (dst == a) {
    T* __restrict d = dst;
    const T* __restrict y = b;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(d[i], y[i]);
  } else {
    T* __restrict d = dst;
    const T* __restrict x = a;
    const T* __restrict y = b;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(x[i], y[i]);
  }
}

/// How `reduce_vec16` splits `n` elements of `elem` bytes at `dst`, `a`, `b`: a scalar head up
/// to the first 16-byte boundary, `packs` 16-byte packs, then a scalar tail from `tail`. When
/// the three pointers are not equally misaligned everything is scalar (`packs` = 0).
struct Vec16Split {
  std::size_t head = 0;   ///< scalar elements before the first pack
  std::size_t packs = 0;  ///< 16-byte packs after the head
  std::size_t tail = 0;   ///< first element after the packs
};

/// See `Vec16Split`.
RINGFENCE_HOST_DEVICE constexpr Vec16Split vec16_split(std::uintptr_t dst, std::uintptr_t a, std::uintptr_t b, std::size_t n,
                                                       std::size_t elem) noexcept {
  Vec16Split s;
  const std::uintptr_t mis = dst % 16;
  if (elem == 0 || 16 % elem != 0 || a % 16 != mis || b % 16 != mis || mis % elem != 0) {
    s.head = n;
    s.tail = n;
    return s;
  }
  const std::size_t to_boundary = static_cast<std::size_t>((16 - mis) % 16) / elem;
  s.head = to_boundary < n ? to_boundary : n;
  s.packs = (n - s.head) / (16 / elem);
  s.tail = s.head + s.packs * (16 / elem);
  return s;
}

/// One thread's share of a vectorised element-wise combine (`dst[i] = op(a[i], b[i])`),
/// thread `tid` of `threads`: the GPU kernels (reduce_kernels.cuh) run it with
/// tid = blockIdx.x * blockDim.x + threadIdx.x; the CPU tests run every tid in turn. 16-byte
/// loads and stores on the device; `dst` may equal `a` or `b` exactly.
template <class T, class Op>
RINGFENCE_HOST_DEVICE inline void reduce_vec16(T* dst, const T* a, const T* b, std::size_t n, Op op, std::size_t tid,
                                               std::size_t threads) noexcept {
  constexpr std::size_t kLanes = 16 / sizeof(T);
  struct alignas(16) Pack {
    T v[kLanes];
  };
  const Vec16Split s = vec16_split(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(a),
                                   reinterpret_cast<std::uintptr_t>(b), n, sizeof(T));
  for (std::size_t i = tid; i < s.head; i += threads) dst[i] = op(a[i], b[i]);
  for (std::size_t p = tid; p < s.packs; p += threads) {
    const std::size_t at = s.head + p * kLanes;
    Pack x, y, r;
#ifdef __CUDA_ARCH__
    x = *reinterpret_cast<const Pack*>(a + at);
    y = *reinterpret_cast<const Pack*>(b + at);
#else
    for (std::size_t k = 0; k < kLanes; ++k) {
      x.v[k] = a[at + k];
      y.v[k] = b[at + k];
    }
#endif
    for (std::size_t k = 0; k < kLanes; ++k) r.v[k] = op(x.v[k], y.v[k]);
#ifdef __CUDA_ARCH__
    *reinterpret_cast<Pack*>(dst + at) = r;
#else
    for (std::size_t k = 0; k < kLanes; ++k) dst[at + k] = r.v[k];
#endif
  }
  for (std::size_t i = s.tail + tid; i < n; i += threads) dst[i] = op(a[i], b[i]);
}

/// Type-erased element-wise combine: `dst = a op b` over `n` elements. Never throws.
using CombineFn = void (*)(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept;

/// The two kernels an engine needs for one (type, op): `combine` for intermediate steps and
/// `finish` for the step that produces the final value (differs from `combine` only for avg).
/// Plain function pointers: cheap to copy, no allocation, safe on the data path.
struct Reducer {
  CombineFn combine = nullptr;  ///< dst = a op b (avg: a + b)
  CombineFn finish = nullptr;   ///< dst = a op b (avg: (a + b) / divisor)
  std::size_t elem_size = 0;    ///< bytes per element
  DataType type = DataType::Uint8;  ///< what it reduces (the device kernels are chosen by it)
  ReduceOp op = ReduceOp::Sum;
};

/// Returns the host reducer for (type, op). Thread-safe; returns a reducer with null
/// functions for out-of-range enumerators.
Reducer host_reducer(DataType type, ReduceOp op) noexcept;
/// The same from the build's baseline kernels, whatever the CPU has (tests compare the two).
Reducer host_reducer_baseline(DataType type, ReduceOp op) noexcept;
/// Which compiled kernels `host_reducer` and `copy_bytes` use on this CPU: "x86-64-v3" (AVX2,
/// F16C, FMA; x86-64 builds) or "baseline" (what the build targets). Chosen once, at first use.
const char* reduce_kernels() noexcept;

/// `memcpy` for the data path (staging writes, receive copies). From 512 bytes to 256 KiB it
/// uses a 32-byte vector loop where the build targets AVX2: glibc picks `rep movsb` for mid-sized
/// copies, which some virtualised CPUs run at a few GB/s instead of tens (measured 3.8 vs
/// 72 GB/s at 64 KiB on the development VM with a copy loop test). Never throws.
namespace detail {
/// `copy_bytes` of kCopyBytesByMemcpy bytes or more: the chosen kernels' copy (reduce_dispatch.cpp).
void copy_bytes_large(void* dst, const void* src, std::size_t n) noexcept;
}  // namespace detail
/// Below this many bytes every kernel copies with `memcpy`, so `copy_bytes` does it inline: a
/// small call's copies skip the hop to the chosen kernels.
inline constexpr std::size_t kCopyBytesByMemcpy = 512;
inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  if (n < kCopyBytesByMemcpy) {
    std::memcpy(dst, src, n);
    return;
  }
  detail::copy_bytes_large(dst, src, n);
}

/// `copy_bytes` that also returns the CRC32C of the bytes copied (of `src`), computed in the
/// same pass: with AVX-512 folding interleaved with the copy, else block by block from the L1
/// cache. A receiver's copy out of a staging slot uses it; transports that copy through the CPU
/// answer `WriteOp::crc` with `staging_copy_crc`. Never throws.
std::uint32_t copy_bytes_crc(void* dst, const void* src, std::size_t n) noexcept;

/// `copy_bytes` and `copy_bytes_crc` with streaming (non-temporal) stores: the destination's
/// lines are neither read before they are written nor kept in the cache, which saves a third of
/// a copy's memory traffic when the destination is not read again soon (a large collective's
/// final values: `kStreamResultMinBytes`). The stores are fenced before they return. Under
/// 256 bytes, where the destination is not aligned (16 bytes; 64 for the CRC variant), above a
/// slot (256 KiB, the CRC variant) or where the CPU lacks the instructions they are the plain
/// functions. Never throw.
void copy_bytes_stream(void* dst, const void* src, std::size_t n) noexcept;
std::uint32_t copy_bytes_crc_stream(void* dst, const void* src, std::size_t n) noexcept;

/// Up to this many bytes `staging_copy_crc` copies first and reads the source again for the
/// CRC: a third of a 48 KiB L1 data cache, so the second read hits it.
inline constexpr std::size_t kCopyThenCrcMaxBytes = 16 * 1024;

/// `copy_bytes_crc` for a sender's copy of its own bytes into a peer's staging slot (the CRC is
/// of `src`, which stays as it is for the call). Up to `kCopyThenCrcMaxBytes` it runs the plain
/// copy and then the CRC over `src` from the L1 cache, off the stores' path: folding
/// interleaved with stores into lines another core holds made a checked 2-rank allreduce of
/// 2-4 KiB 0.2-0.3 us slower than copying first (docs/protection-cost.md). Larger copies fold
/// in the same pass, which saves a read of a source that no longer fits the cache. A receiver
/// keeps `copy_bytes_crc`: its CRC must be of the very bytes it stored. Never throws.
std::uint32_t staging_copy_crc(void* dst, const void* src, std::size_t n) noexcept;

/// `staging_copy_crc` with streaming stores, for a write the engine asks to stream
/// (`WriteOp::stream`): up to `kCopyThenCrcMaxBytes` `copy_bytes_stream` and then the CRC of
/// `src` from the cache, above it `copy_bytes_crc_stream`. Never throws.
std::uint32_t staging_copy_crc_stream(void* dst, const void* src, std::size_t n) noexcept;

/// `staging_copy_crc` (`stream`: `staging_copy_crc_stream`) that also stores the bytes at
/// `also` (plain stores), reading `src` once: a sender's own block that goes into its output and
/// into a peer's slot (`WriteAlso`). `also` overlaps neither `dst` nor `src`. Returns the CRC32C
/// of `src`. Never throws.
std::uint32_t staging_copy2_crc(void* dst, void* also, const void* src, std::size_t n, bool stream) noexcept;

/// `copy_bytes` (`stream`: `copy_bytes_stream`) into `dst` that also stores the bytes at `also`,
/// reading `src` from memory once: `staging_copy2_crc` without the CRC. Never throws.
void copy_bytes2(void* dst, void* also, const void* src, std::size_t n, bool stream) noexcept;

}  // namespace ringfence
