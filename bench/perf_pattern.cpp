// Verifiable data of the perf programs (perf_pattern.hpp).
#include "perf_pattern.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ringfence/half.hpp>
#include <type_traits>

#include "perf_common.hpp"

namespace ringfence::bench {
namespace {

// ------------------------------------------------------------------------------------------
// Verifiable data
//
// Every input is a small integer, so each reduction is exact in any association order and
// ranks can be checked bit for bit against a host reference (nccl-tests' `verifiable` idea,
// without a device). Element i of rank r uses j = i mod kPeriod and b(j) = j*j + 7*j:
//   sum, avg : (b(j) + 3r) mod M, M = 7 for 8-bit integers and 16-bit floats, else 13
//   prod     : 2 when (b(j) + r) mod 5 == 0, else 1 (at most ceil(n/5) twos per element)
//   min, max : (13*b(j) + 7r) mod 101, minus 50 for signed and floating types
// Exactness limits: sums stay exact while 6n <= 256 for bfloat16 (n <= 42) and 6n <= 127 for
// int8 (n <= 21; beyond that integer sums wrap, which ringfence defines and the reference
// models); products stay finite in half while ceil(n/5) <= 15 (n <= 75).
// kPeriod is prime, so no power-of-two shift (chunk, slot or segment offset) maps the pattern
// onto itself: a block written to the wrong place shows up as wrong elements.
// ------------------------------------------------------------------------------------------

constexpr std::size_t kPeriod = kPatternPeriod;

bool is_unsigned(DataType t) { return t == DataType::Uint8 || t == DataType::Uint32 || t == DataType::Uint64; }
bool is_small(DataType t) {
  return t == DataType::Int8 || t == DataType::Uint8 || t == DataType::Float16 || t == DataType::BFloat16;
}

std::int64_t input_value(std::size_t j, int r, DataType t, ReduceOp op) {
  const std::uint64_t b = static_cast<std::uint64_t>(j) * j + 7 * j;
  const auto ur = static_cast<std::uint64_t>(r);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<std::int64_t>((b + 3 * ur) % (is_small(t) ? 7 : 13));
    case ReduceOp::Prod: return (b + ur) % 5 == 0 ? 2 : 1;
    case ReduceOp::Min:
    case ReduceOp::Max: {
      const auto v = static_cast<std::int64_t>((13 * b + 7 * ur) % 101);
      return is_unsigned(t) ? v : v - 50;
    }
  }
  return 0;
}

// Converts an exact integer to the element type: integers wrap modulo 2^bits (ringfence's and
// NCCL's integer semantics), floats round once to nearest even.
template <class T>
T from_exact(std::int64_t v) {
  if constexpr (std::is_same_v<T, Half>) return to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(static_cast<float>(v));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(v);
  else return static_cast<T>(static_cast<std::uint64_t>(v));
}

// 2^k in the element type (integers modulo 2^bits; floats overflow to +inf, as a per-step
// rounded product of powers of two does).
template <class T>
T pow2(int k) {
  if constexpr (std::is_same_v<T, Half>) return to_half(std::ldexp(1.0f, k));
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(std::ldexp(1.0f, k));
  else if constexpr (std::is_floating_point_v<T>) return std::ldexp(static_cast<T>(1), k);
  else return static_cast<T>(k < 64 ? std::uint64_t{1} << k : 0);
}

// ringfence's avg: the exact sum (held in the element type, wrapping for integers), then one
// division by the rank count (truncating for integers; in float for the 16-bit floats).
template <class T>
T divide(T sum, int n) {
  if constexpr (std::is_same_v<T, Half>) return to_half(to_float(sum) / static_cast<float>(n));
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(to_float(sum) / static_cast<float>(n));
  else return static_cast<T>(sum / static_cast<T>(n));
}

template <class T>
void make_input(T* out, int rank, DataType t, ReduceOp op) {
  for (std::size_t j = 0; j < kPeriod; ++j) out[j] = from_exact<T>(input_value(j, rank, t, op));
}

template <class T>
void make_expected(T* out, int n, DataType t, ReduceOp op) {
  for (std::size_t j = 0; j < kPeriod; ++j) {
    std::int64_t sum = 0, lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
    int twos = 0;
    for (int r = 0; r < n; ++r) {
      const std::int64_t v = input_value(j, r, t, op);
      sum += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      twos += v == 2;
    }
    switch (op) {
      case ReduceOp::Sum: out[j] = from_exact<T>(sum); break;
      case ReduceOp::Avg: out[j] = divide<T>(from_exact<T>(sum), n); break;
      case ReduceOp::Prod: out[j] = pow2<T>(twos); break;
      case ReduceOp::Min: out[j] = from_exact<T>(lo); break;
      case ReduceOp::Max: out[j] = from_exact<T>(hi); break;
    }
  }
}

// Calls f.template operator()<T>() with T the storage type of `t`.
template <class F>
void dispatch(DataType t, F&& f) {
  switch (t) {
    case DataType::Int8: f.template operator()<std::int8_t>(); break;
    case DataType::Uint8: f.template operator()<std::uint8_t>(); break;
    case DataType::Int32: f.template operator()<std::int32_t>(); break;
    case DataType::Uint32: f.template operator()<std::uint32_t>(); break;
    case DataType::Int64: f.template operator()<std::int64_t>(); break;
    case DataType::Uint64: f.template operator()<std::uint64_t>(); break;
    case DataType::Float16: f.template operator()<Half>(); break;
    case DataType::BFloat16: f.template operator()<BFloat16>(); break;
    case DataType::Float32: f.template operator()<float>(); break;
    case DataType::Float64: f.template operator()<double>(); break;
  }
}


}  // namespace

Pattern make_pattern(DataType t, ReduceOp op, int rank, int n) {
  Pattern p;
  p.elem = size_of(t);
  p.input.resize(kPeriod * p.elem);
  p.expected.resize(kPeriod * p.elem);
  dispatch(t, [&]<class T>() {
    make_input(reinterpret_cast<T*>(p.input.data()), rank, t, op);
    make_expected(reinterpret_cast<T*>(p.expected.data()), n, t, op);
  });
  return p;
}

// Formats element `i` of `buf` as a number (for the first-mismatch diagnostic).
std::string element_string(const void* buf, std::size_t i, DataType t) {
  std::string s;
  dispatch(t, [&]<class T>() {
    const T v = static_cast<const T*>(buf)[i];
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) s = std::to_string(to_float(v));
    else s = std::to_string(v);
  });
  return s;
}


void divide_by_ranks(void* data, std::size_t count, DataType type, int ranks) {
  dispatch(type, [&]<class T>() {
    T* d = static_cast<T*>(data);
    for (std::size_t i = 0; i < count; ++i) d[i] = divide<T>(d[i], ranks);
  });
}

}  // namespace ringfence::bench
