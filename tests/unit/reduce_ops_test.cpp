// Reduction functors and the 16-bit float conversions they rely on.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <ringfence/reduce_ops.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {
float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Reference conversions through the compiler's IEEE binary16 type (libgcc soft-float).
std::uint16_t ref_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float ref_half_to_float(std::uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
// Nearest bfloat16 by comparing the two neighbours exactly in double (ties to even).
std::uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return 0;  // checked separately
  const std::uint32_t u = float_to_bits(f);
  const std::uint32_t lo = u & 0xffff0000u;
  const std::uint32_t hi = lo + 0x10000u;
  const double dl = std::fabs(static_cast<double>(bits_to_float(lo)) - f);
  const double dh = std::isinf(bits_to_float(hi)) && !std::isinf(f)
                        ? std::fabs(std::copysign(std::ldexp(1.0, 128), static_cast<double>(f)) - static_cast<double>(f))
                        : std::fabs(static_cast<double>(bits_to_float(hi)) - f);
  if (dl < dh) return static_cast<std::uint16_t>(lo >> 16);
  if (dh < dl) return static_cast<std::uint16_t>(hi >> 16);
  return static_cast<std::uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}
}  // namespace

TEST_CASE("float16 widening is exact for all 65536 values", "[reduce][half]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float got = to_float(Half{static_cast<std::uint16_t>(b)});
    const float want = ref_half_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      INFO("bits " << b);
      REQUIRE(float_to_bits(got) == float_to_bits(want));
    }
  }
}

TEST_CASE("float16 rounding matches IEEE round-to-nearest-even", "[reduce][half]") {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                               6.1035156e-05f, 6.1e-05f, std::numeric_limits<float>::infinity(), 1.00048828125f,
                               1.000732421875f, 2049.0f, 2051.0f, std::numeric_limits<float>::denorm_min()};
  // Every float16 value, every midpoint between neighbours, and nudges either side.
  for (std::uint32_t b = 0; b < 0x7c00; ++b) {
    const float v = ref_half_to_float(static_cast<std::uint16_t>(b));
    const float next = ref_half_to_float(static_cast<std::uint16_t>(b + 1));
    const float mid = static_cast<float>((static_cast<double>(v) + next) / 2);
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) values.push_back(bits_to_float(rng()));
  for (float f : values) {
    if (std::isnan(f)) {
      REQUIRE(std::isnan(to_float(to_half(f))));
      continue;
    }
    INFO("value " << f << " bits " << float_to_bits(f));
    REQUIRE(to_half(f).bits == ref_half(f));
  }
  REQUIRE(std::isnan(to_float(to_half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("bfloat16 conversions round to nearest even and keep NaN", "[reduce][bf16]") {
  std::mt19937 rng(7);
  for (int i = 0; i < 300000; ++i) {
    const float f = bits_to_float(rng());
    if (std::isnan(f)) {
      REQUIRE(std::isnan(to_float(to_bfloat16(f))));
      continue;
    }
    INFO("bits " << float_to_bits(f));
    REQUIRE(to_bfloat16(f).bits == ref_bf16(f));
  }
  REQUIRE(to_bfloat16(1.0f).bits == 0x3f80);
  REQUIRE(to_float(BFloat16{0x3f80}) == 1.0f);
  REQUIRE(to_bfloat16(bits_to_float(0x3f808000u)).bits == 0x3f80);  // tie -> even
  REQUIRE(to_bfloat16(bits_to_float(0x3f818000u)).bits == 0x3f82);  // tie -> even (up)
}

namespace {

// Reference result of `a op b` computed in a wide type, then stored as T.
template <class T>
T reference(ReduceOp op, T a, T b, int divisor, bool last) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    const float x = to_float(a), y = to_float(b);
    float r = 0;
    switch (op) {
      case ReduceOp::Sum: r = x + y; break;
      case ReduceOp::Prod: r = x * y; break;
      case ReduceOp::Min: r = y < x ? y : x; break;
      case ReduceOp::Max: r = x < y ? y : x; break;
      case ReduceOp::Avg: r = last ? (x + y) / static_cast<float>(divisor) : x + y; break;
    }
    if constexpr (std::is_same_v<T, Half>) return to_half(r);
    else return to_bfloat16(r);
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::Sum: return a + b;
      case ReduceOp::Prod: return a * b;
      case ReduceOp::Min: return b < a ? b : a;
      case ReduceOp::Max: return a < b ? b : a;
      case ReduceOp::Avg: return last ? (a + b) / static_cast<T>(divisor) : a + b;
    }
  } else {
    using U = std::make_unsigned_t<T>;
    const U ua = static_cast<U>(a), ub = static_cast<U>(b);
    switch (op) {
      case ReduceOp::Sum: return static_cast<T>(static_cast<U>(ua + ub));
      case ReduceOp::Prod: return static_cast<T>(static_cast<U>(static_cast<std::uint64_t>(ua) * ub));
      case ReduceOp::Min: return b < a ? b : a;
      case ReduceOp::Max: return a < b ? b : a;
      case ReduceOp::Avg: {
        const T sum = static_cast<T>(static_cast<U>(ua + ub));
        return last ? static_cast<T>(sum / static_cast<T>(divisor)) : sum;
      }
    }
  }
  return T{};
}

template <class T>
T make_value(std::mt19937& rng) {
  if constexpr (std::is_same_v<T, Half>) return to_half(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8);
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8);
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(static_cast<int>(rng() % 200001) - 100000) / 64;
  else return static_cast<T>(rng());  // full range: exercises wrap-around
}

template <class T>
std::uint64_t bits_of(T v) {
  std::uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}

template <class T>
void check_type(DataType type) {
  std::mt19937 rng(static_cast<unsigned>(type) + 1);
  constexpr std::size_t n = 1037;  // odd: exercises the vector loop's remainder
  std::vector<T> a(n), b(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = make_value<T>(rng);
    b[i] = make_value<T>(rng);
  }
  for (int o = 0; o < kNumReduceOps; ++o) {
    const auto op = static_cast<ReduceOp>(o);
    const Reducer r = host_reducer(type, op);
    REQUIRE(r.elem_size == sizeof(T));
    for (bool last : {false, true}) {
      INFO(to_string(type) << " " << to_string(op) << " last=" << last);
      const CombineFn fn = last ? r.finish : r.combine;
      fn(out.data(), a.data(), b.data(), n, 3);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(out[i]) == bits_of(reference(op, a[i], b[i], 3, last)));
      // In place on either operand gives the same bits.
      std::vector<T> x = a;
      fn(x.data(), x.data(), b.data(), n, 3);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(x[i]) == bits_of(out[i]));
      std::vector<T> y = b;
      fn(y.data(), a.data(), y.data(), n, 3);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(y[i]) == bits_of(out[i]));
    }
  }
}

}  // namespace

TEST_CASE("host reducers match a reference for every type and op", "[reduce]") {
  check_type<std::int8_t>(DataType::Int8);
  check_type<std::uint8_t>(DataType::Uint8);
  check_type<std::int32_t>(DataType::Int32);
  check_type<std::uint32_t>(DataType::Uint32);
  check_type<std::int64_t>(DataType::Int64);
  check_type<std::uint64_t>(DataType::Uint64);
  check_type<Half>(DataType::Float16);
  check_type<BFloat16>(DataType::BFloat16);
  check_type<float>(DataType::Float32);
  check_type<double>(DataType::Float64);
}

namespace {
// The scalar functors (what the device code and the vector loops' tails run).
template <class T>
T scalar_op(ReduceOp op, T a, T b, int divisor, bool last) {
  switch (op) {
    case ReduceOp::Sum: return SumOp<T>{}(a, b);
    case ReduceOp::Prod: return ProdOp<T>{}(a, b);
    case ReduceOp::Min: return MinOp<T>{}(a, b);
    case ReduceOp::Max: return MaxOp<T>{}(a, b);
    case ReduceOp::Avg: return last ? SumDivOp<T>{divisor}(a, b) : SumOp<T>{}(a, b);
  }
  return T{};
}
}  // namespace

TEST_CASE("16-bit float kernels match the scalar functors bit for bit over every bit pattern", "[reduce][half][bf16]") {
  // Every 16-bit pattern (zeros, denormals, infinities, quiet and signalling NaNs) as `a`,
  // against patterns spread over the range as `b`: the vector bodies (F16C / AVX2 where built)
  // must agree with the scalar functors (the tail, and the device code) on every element. A
  // NaN result must be NaN on both paths; its payload may differ (F16C keeps payload bits,
  // the scalar conversion returns the canonical quiet NaN), as it does on GPUs.
  constexpr std::size_t n = 65536;
  std::vector<std::uint16_t> a(n), b(n), out(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<std::uint16_t>(i);
  for (std::uint32_t shift : {0u, 1u, 12345u, 40000u}) {
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint16_t>((i * 7919u + shift) & 0xffffu);
    for (DataType type : {DataType::Float16, DataType::BFloat16})
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto op = static_cast<ReduceOp>(o);
        const Reducer r = host_reducer(type, op);
        for (bool last : {false, true}) {
          (last ? r.finish : r.combine)(out.data(), a.data(), b.data(), n, 3);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t want = type == DataType::Float16 ? scalar_op(op, Half{a[i]}, Half{b[i]}, 3, last).bits
                                                                 : scalar_op(op, BFloat16{a[i]}, BFloat16{b[i]}, 3, last).bits;
            auto is_nan = [&](std::uint16_t v) {
              return type == DataType::Float16 ? (v & 0x7fffu) > 0x7c00u : (v & 0x7fffu) > 0x7f80u;
            };
            wrong += out[i] == want || (is_nan(out[i]) && is_nan(want)) ? 0 : 1;
          }
          INFO(to_string(type) << " " << to_string(op) << " last=" << last << " shift=" << shift);
          REQUIRE(wrong == 0);
        }
      }
  }
}

TEST_CASE("integer sums wrap instead of invoking undefined behaviour", "[reduce]") {
  const std::int32_t a[] = {std::numeric_limits<std::int32_t>::max()}, b[] = {1};
  std::int32_t out[1];
  host_reducer(DataType::Int32, ReduceOp::Sum).combine(out, a, b, 1, 1);
  REQUIRE(out[0] == std::numeric_limits<std::int32_t>::min());
  const std::int8_t c[] = {-7}, d[] = {0};
  std::int8_t avg[1];
  host_reducer(DataType::Int8, ReduceOp::Avg).finish(avg, c, d, 1, 2);
  REQUIRE(avg[0] == -3);  // truncates toward zero
}

TEST_CASE("invalid enumerators give an empty reducer", "[reduce]") {
  REQUIRE(host_reducer(static_cast<DataType>(99), ReduceOp::Sum).combine == nullptr);
  REQUIRE(host_reducer(DataType::Float32, static_cast<ReduceOp>(99)).combine == nullptr);
  REQUIRE(size_of(DataType::BFloat16) == 2);
  REQUIRE(parse_data_type("bf16") == DataType::BFloat16);
  REQUIRE(parse_reduce_op("avg") == ReduceOp::Avg);
  REQUIRE_FALSE(parse_reduce_op("mean").has_value());
}

TEST_CASE("vec16_split: scalar head to the 16-byte boundary, packs, scalar tail", "[reduce][vec16]") {
  // Equally misaligned floats: 2 head elements (8 -> 16), then packs of 4.
  const auto s = vec16_split(0x1008, 0x2008, 0x3008, 19, 4);
  CHECK(s.head == 2);
  CHECK(s.packs == 4);
  CHECK(s.tail == 18);
  // Aligned: no head.
  const auto t = vec16_split(0x1000, 0x2000, 0x3000, 8, 8);
  CHECK((t.head == 0 && t.packs == 4 && t.tail == 8));
  // Differently misaligned: all scalar.
  const auto u = vec16_split(0x1000, 0x2004, 0x3000, 100, 4);
  CHECK((u.head == 100 && u.packs == 0 && u.tail == 100));
  // Fewer elements than the head: head = n, no packs.
  const auto v = vec16_split(0x1001, 0x2001, 0x3001, 3, 1);
  CHECK((v.head == 3 && v.packs == 0 && v.tail == 3));
  // Misaligned by less than an element: all scalar.
  const auto w = vec16_split(0x1002, 0x2002, 0x3002, 64, 4);
  CHECK((w.head == 64 && w.packs == 0));
}

namespace {
// Runs reduce_vec16 as a grid of `threads` (every tid in turn) and compares with reduce_loop.
template <class T, class Op>
std::size_t vec16_mismatches(Op op, std::size_t n, std::size_t off_d, std::size_t off_a, std::size_t off_b, std::size_t threads,
                             bool in_place) {
  std::vector<T> a(n + 8), b(n + 8), d(n + 8), want(n + 8);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = ringfence::test::from_integer<T>(static_cast<long long>((i * 5 + 3) % 11));
    b[i] = ringfence::test::from_integer<T>(static_cast<long long>((i * 3 + 1) % 7));
  }
  T* dst = in_place ? a.data() + off_a : d.data() + off_d;
  std::vector<T> a0 = a;
  reduce_loop(want.data(), a0.data() + off_a, b.data() + off_b, n, op);
  for (std::size_t tid = 0; tid < threads; ++tid) reduce_vec16(dst, a.data() + off_a, b.data() + off_b, n, op, tid, threads);
  return static_cast<std::size_t>(std::memcmp(dst, want.data(), n * sizeof(T)) != 0);
}
}  // namespace

TEST_CASE("reduce_vec16 as a grid of threads equals the scalar loop at every alignment", "[reduce][vec16]") {
  std::size_t bad = 0, runs = 0;
  for (std::size_t n : {0u, 1u, 7u, 15u, 16u, 17u, 33u, 1001u})
    for (std::size_t off_d = 0; off_d < 3; ++off_d)
      for (std::size_t off_a = 0; off_a < 3; ++off_a)
        for (std::size_t threads : {1u, 3u, 64u})
          for (bool in_place : {false, true}) {
            bad += vec16_mismatches<std::int8_t>(SumOp<std::int8_t>{}, n, off_d, off_a, off_a, threads, in_place);
            bad += vec16_mismatches<Half>(MaxOp<Half>{}, n, off_d, off_a, off_d, threads, in_place);
            bad += vec16_mismatches<BFloat16>(SumOp<BFloat16>{}, n, off_a, off_a, off_a, threads, in_place);
            bad += vec16_mismatches<float>(ProdOp<float>{}, n, off_d, off_a, off_a, threads, in_place);
            bad += vec16_mismatches<double>(SumDivOp<double>{3}, n, off_a, off_a, off_a, threads, in_place);
            bad += vec16_mismatches<std::uint64_t>(MinOp<std::uint64_t>{}, n, off_d, off_d, off_d, threads, in_place);
            runs += 6;
          }
  INFO(runs << " runs");
  REQUIRE(bad == 0);
}

// The run-time choice between the baseline kernels and the x86-64-v3 copy (src/reduce_dispatch.cpp):
// the fast copy is chosen where the CPU has it, and both give the same bits for every type and op
// (random bit patterns, so NaNs, infinities and subnormals of every float type are included;
// float16 NaN inputs are left out: F16C keeps a NaN's payload where the scalar path does not).
TEST_CASE("reduction kernels: x86-64-v3 chosen where the CPU has it, bit-identical to the baseline", "[reduce][dispatch]") {
#if defined(__x86_64__)
  __builtin_cpu_init();
  CHECK(std::string(reduce_kernels()) == (__builtin_cpu_supports("x86-64-v3") ? "x86-64-v3" : "baseline"));
#else
  CHECK(std::string(reduce_kernels()) == "baseline");
#endif
  std::mt19937_64 rng(7);
  const DataType types[] = {DataType::Int8,    DataType::Uint8,    DataType::Int32,   DataType::Uint32,  DataType::Int64,
                            DataType::Uint64,  DataType::Float16,  DataType::BFloat16, DataType::Float32, DataType::Float64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};
  for (DataType t : types)
    for (ReduceOp op : ops) {
      const Reducer fast = host_reducer(t, op), base = host_reducer_baseline(t, op);
      REQUIRE(fast.combine != nullptr);
      REQUIRE(base.combine != nullptr);
      REQUIRE(fast.elem_size == base.elem_size);
      const std::size_t n = 1000 + 37;  // vector bodies and scalar tails
      std::vector<std::uint8_t> a(n * fast.elem_size), b(a.size()), x(a.size()), y(a.size());
      for (auto& v : a) v = static_cast<std::uint8_t>(rng());
      for (auto& v : b) v = static_cast<std::uint8_t>(rng());
      if (t == DataType::Float16)  // NaN inputs: F16C keeps their payload, the scalar path does not (docs/tuning.md)
        for (auto* buf : {&a, &b})
          for (std::size_t i = 1; i < buf->size(); i += 2)
            if (((*buf)[i] & 0x7c) == 0x7c && (((*buf)[i] & 0x03) | (*buf)[i - 1]) != 0) (*buf)[i] &= 0xfb;  // NaN -> finite
      for (CombineFn Reducer::*fn : {&Reducer::combine, &Reducer::finish}) {
        (fast.*fn)(x.data(), a.data(), b.data(), n, 3);
        (base.*fn)(y.data(), a.data(), b.data(), n, 3);
        INFO(to_string(t) << " " << to_string(op));
        CHECK(std::memcmp(x.data(), y.data(), x.size()) == 0);
      }
    }
  // copy_bytes (dispatched too) copies exactly, across its vector and glibc ranges.
  for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{4099}, std::size_t{300000}}) {
    std::vector<std::uint8_t> src(n), dst(n, 0);
    for (auto& v : src) v = static_cast<std::uint8_t>(rng());
    copy_bytes(dst.data(), src.data(), n);
    CHECK(dst == src);
  }
}
