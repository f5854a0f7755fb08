#pragma once
// Inputs whose reductions are exact in any order (nccl-tests' "verifiable" idea), and the
// exact expected result, for every data type and op. Shared by unit and multi-process tests.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ringfence/reduce_ops.hpp>
#include <type_traits>

namespace ringfence::test {

// The value rank `r` of `n` contributes at element `i`, as a small integer (exact in every type).
inline long long input_value(ReduceOp op, bool is_signed, int r, int n, std::size_t i) {
  (void)n;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<long long>((i * 7 + static_cast<std::size_t>(r) * 3) % 13);
    case ReduceOp::Prod: {
      const long long mag = (i + static_cast<std::size_t>(r)) % 3 == 0 ? 2 : 1;  // product <= 2^ceil(n/3)
      return is_signed && (i * static_cast<std::size_t>(r + 1)) % 4 == 1 ? -mag : mag;
    }
    case ReduceOp::Min:
    case ReduceOp::Max: {
      const long long v = static_cast<long long>((i * 13 + static_cast<std::size_t>(r) * 7) % 101);
      return is_signed ? v - 50 : v;
    }
  }
  return 0;
}

inline long long expected_value(ReduceOp op, bool is_signed, int n, std::size_t i) {
  long long acc = input_value(op, is_signed, 0, n, i);
  for (int r = 1; r < n; ++r) {
    const long long v = input_value(op, is_signed, r, n, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = v < acc ? v : acc; break;
      case ReduceOp::Max: acc = v > acc ? v : acc; break;
    }
  }
  return acc;
}

template <class T>
constexpr bool signed_like() {
  return std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> || std::is_signed_v<T>;
}

template <class T>
T from_integer(long long v) {
  if constexpr (std::is_same_v<T, Half>) return to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Expected element: exact integer result, except avg which divides once in the compute type.
template <class T>
T expected_element(ReduceOp op, int n, std::size_t i) {
  const long long e = expected_value(op, signed_like<T>(), n, i);
  if (op != ReduceOp::Avg) return from_integer<T>(e);
  if constexpr (std::is_same_v<T, Half>) return to_half(static_cast<float>(e) / static_cast<float>(n));
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(static_cast<float>(e) / static_cast<float>(n));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(static_cast<T>(e) / static_cast<T>(n));
  else return static_cast<T>(static_cast<T>(e) / static_cast<T>(n));
}

template <class F>
decltype(auto) with_type(DataType type, F&& f) {
  switch (type) {
    case DataType::Int8: return f(std::int8_t{});
    case DataType::Uint8: return f(std::uint8_t{});
    case DataType::Int32: return f(std::int32_t{});
    case DataType::Uint32: return f(std::uint32_t{});
    case DataType::Int64: return f(std::int64_t{});
    case DataType::Uint64: return f(std::uint64_t{});
    case DataType::Float16: return f(Half{});
    case DataType::BFloat16: return f(BFloat16{});
    case DataType::Float32: return f(float{});
    case DataType::Float64: return f(double{});
  }
  return f(std::uint8_t{});
}

// Fills `count` elements of rank `r`'s input; element i holds the value of global index
// `first + i` (blocks of reduce-scatter and alltoall use their offset in the whole vector).
inline void fill_input(DataType type, ReduceOp op, int r, int n, void* buf, std::size_t count, std::size_t first = 0) {
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto* p = static_cast<T*>(buf);
    for (std::size_t i = 0; i < count; ++i) p[i] = from_integer<T>(input_value(op, signed_like<T>(), r, n, first + i));
  });
}

// Number of elements of `buf` that differ bitwise from the exact expected result at global
// indices [first, first + count).
inline std::size_t count_wrong(DataType type, ReduceOp op, int n, const void* buf, std::size_t count, std::size_t first = 0) {
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const auto* p = static_cast<const T*>(buf);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const T want = expected_element<T>(op, n, first + i);
      if (std::memcmp(&p[i], &want, sizeof(T)) != 0) ++wrong;
    }
    return wrong;
  });
}

// Data-movement collectives (allgather, broadcast, alltoall): rank `r`'s pattern at global
// indices [first, first + count), distinct per rank and index (period 101).
inline void fill_pattern(DataType type, int r, void* buf, std::size_t count, std::size_t first = 0) {
  fill_input(type, ReduceOp::Max, r, 1, buf, count, first);
}
/// Elements of `buf` that differ from rank `r`'s pattern at [first, first + count).
inline std::size_t count_wrong_pattern(DataType type, int r, const void* buf, std::size_t count, std::size_t first = 0) {
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const auto* p = static_cast<const T*>(buf);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const T want = from_integer<T>(input_value(ReduceOp::Max, signed_like<T>(), r, 1, first + i));
      if (std::memcmp(&p[i], &want, sizeof(T)) != 0) ++wrong;
    }
    return wrong;
  });
}

}  // namespace ringfence::test
