// Host reduction kernels. Compiled with -O3 so the element loops in reduce_ops.hpp vectorise;
// this is the only place the element-type templates are instantiated for the host, 10 types x
// 5 ops. Compiled twice (docs/tuning.md, "CPU features"): as it is, for the build's baseline
// (namespace detail::baseline), and by reduce_x86_64_v3.cpp with -march=x86-64-v3 (namespace
// detail::x86_64_v3); reduce_dispatch.cpp picks one at run time. Everything here has internal
// linkage or lives in the variant's namespace, so the two objects share no inline function
// (tests/build_checks/check_simd.sh checks that neither defines a weak symbol).
#include <cstring>
#include <ringfence/reduce_ops.hpp>

#if defined(__AVX__)
#include <immintrin.h>
#endif
#ifndef RINGFENCE_REDUCE_VARIANT
#define RINGFENCE_REDUCE_VARIANT baseline
#endif

#if defined(__F16C__) && defined(__AVX__)
#define RINGFENCE_HAVE_F16C 1
#else
#define RINGFENCE_HAVE_F16C 0
#endif

namespace ringfence {
namespace {

#if RINGFENCE_HAVE_F16C
// float16 with F16C: 8 elements per step, widened to float, combined, rounded to nearest even
// by vcvtps2ph, exactly as the scalar functors do (same IEEE operation, same rounding), so the
// vector body and the scalar tail agree bit for bit. min/max keep the scalar operand order:
// min_ps(b, a) = b < a ? b : a.
enum class HalfKind { Sum, Prod, Min, Max, SumDiv };

template <HalfKind K>
RINGFENCE_FORCEINLINE __m256 half_vec_op(__m256 a, __m256 b, __m256 div) noexcept {
  if constexpr (K == HalfKind::Sum) return _mm256_add_ps(a, b);
  else if constexpr (K == HalfKind::Prod) return _mm256_mul_ps(a, b);
  else if constexpr (K == HalfKind::Min) return _mm256_min_ps(b, a);
  else if constexpr (K == HalfKind::Max) return _mm256_max_ps(b, a);
  else return _mm256_div_ps(_mm256_add_ps(a, b), div);
}

template <HalfKind K, class ScalarOp>
void half_combine(void* dst, const void* a, const void* b, std::size_t n, int divisor, ScalarOp op) noexcept {
  auto* d = static_cast<Half*>(dst);
  const auto* x = static_cast<const Half*>(a);
  const auto* y = static_cast<const Half*>(b);
  const __m256 div = _mm256_set1_ps(static_cast<float>(divisor));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(half_vec_op<K>(va, vb, div), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) d[i] = op(x[i], y[i]);
}

template <HalfKind K, template <class> class Op>
void half_fn(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept {
  half_combine<K>(dst, a, b, n, divisor, Op<Half>{});
}
void half_sum_div(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept {
  half_combine<HalfKind::SumDiv>(dst, a, b, n, divisor, SumDivOp<Half>{divisor});
}

Reducer make_half(ReduceOp op) noexcept {
  Reducer r;
  r.elem_size = sizeof(Half);
  switch (op) {
    case ReduceOp::Sum: r.combine = r.finish = &half_fn<HalfKind::Sum, SumOp>; break;
    case ReduceOp::Prod: r.combine = r.finish = &half_fn<HalfKind::Prod, ProdOp>; break;
    case ReduceOp::Min: r.combine = r.finish = &half_fn<HalfKind::Min, MinOp>; break;
    case ReduceOp::Max: r.combine = r.finish = &half_fn<HalfKind::Max, MaxOp>; break;
    case ReduceOp::Avg:
      r.combine = &half_fn<HalfKind::Sum, SumOp>;
      r.finish = &half_sum_div;
      break;
    default: r = Reducer{}; break;
  }
  return r;
}
#endif

#if defined(__AVX2__)
// bfloat16 with AVX2: 8 elements per step, widened to float exactly (a 16-bit shift), combined
// in float, rounded back with the scalar rule (ties to even, NaN quieted) in integer lanes, so
// vector body and scalar tail agree bit for bit. min/max select one of the operands' original
// bits (as the scalar functors do: no re-rounding, NaN payloads kept).
enum class Bf16Kind { Sum, Prod, Min, Max, SumDiv };

RINGFENCE_FORCEINLINE __m256i bf16_widen(const BFloat16* p) noexcept {
  return _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
}

// Eight 32-bit lanes holding 16-bit results -> eight packed bfloat16 at `p`.
RINGFENCE_FORCEINLINE void bf16_store(BFloat16* p, __m256i v) noexcept {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// to_bfloat16 on eight floats: NaN -> (u >> 16) | 0x40, else (u + 0x7fff + ((u >> 16) & 1)) >> 16.
RINGFENCE_FORCEINLINE __m256i bf16_round(__m256 f) noexcept {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

template <Bf16Kind K, class ScalarOp>
void bf16_combine(void* dst, const void* a, const void* b, std::size_t n, int divisor, ScalarOp op) noexcept {
  auto* d = static_cast<BFloat16*>(dst);
  const auto* x = static_cast<const BFloat16*>(a);
  const auto* y = static_cast<const BFloat16*>(b);
  const __m256 div = _mm256_set1_ps(static_cast<float>(divisor));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i ia = bf16_widen(x + i), ib = bf16_widen(y + i);
    const __m256 va = _mm256_castsi256_ps(ia), vb = _mm256_castsi256_ps(ib);
    __m256i r;
    if constexpr (K == Bf16Kind::Min) {  // b < a ? b : a
      r = _mm256_srli_epi32(_mm256_blendv_epi8(ia, ib, _mm256_castps_si256(_mm256_cmp_ps(vb, va, _CMP_LT_OQ))), 16);
    } else if constexpr (K == Bf16Kind::Max) {  // a < b ? b : a
      r = _mm256_srli_epi32(_mm256_blendv_epi8(ia, ib, _mm256_castps_si256(_mm256_cmp_ps(va, vb, _CMP_LT_OQ))), 16);
    } else if constexpr (K == Bf16Kind::Sum) {
      r = bf16_round(_mm256_add_ps(va, vb));
    } else if constexpr (K == Bf16Kind::Prod) {
      r = bf16_round(_mm256_mul_ps(va, vb));
    } else {
      r = bf16_round(_mm256_div_ps(_mm256_add_ps(va, vb), div));
    }
    bf16_store(d + i, r);
  }
  for (; i < n; ++i) d[i] = op(x[i], y[i]);
}

template <Bf16Kind K, template <class> class Op>
void bf16_fn(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept {
  bf16_combine<K>(dst, a, b, n, divisor, Op<BFloat16>{});
}
void bf16_sum_div(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept {
  bf16_combine<Bf16Kind::SumDiv>(dst, a, b, n, divisor, SumDivOp<BFloat16>{divisor});
}

Reducer make_bf16(ReduceOp op) noexcept {
  Reducer r;
  r.elem_size = sizeof(BFloat16);
  switch (op) {
    case ReduceOp::Sum: r.combine = r.finish = &bf16_fn<Bf16Kind::Sum, SumOp>; break;
    case ReduceOp::Prod: r.combine = r.finish = &bf16_fn<Bf16Kind::Prod, ProdOp>; break;
    case ReduceOp::Min: r.combine = r.finish = &bf16_fn<Bf16Kind::Min, MinOp>; break;
    case ReduceOp::Max: r.combine = r.finish = &bf16_fn<Bf16Kind::Max, MaxOp>; break;
    case ReduceOp::Avg:
      r.combine = &bf16_fn<Bf16Kind::Sum, SumOp>;
      r.finish = &bf16_sum_div;
      break;
    default: r = Reducer{}; break;
  }
  return r;
}
#endif

template <class T, template <class> class Op>
void combine(void* dst, const void* a, const void* b, std::size_t n, int /*divisor*/) noexcept {
  reduce_loop(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, Op<T>{});
}

template <class T>
void sum_div(void* dst, const void* a, const void* b, std::size_t n, int divisor) noexcept {
  reduce_loop(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, SumDivOp<T>{divisor});
}

template <class T>
Reducer make(ReduceOp op) noexcept {
  Reducer r;
  r.elem_size = sizeof(T);
  switch (op) {
    case ReduceOp::Sum: r.combine = r.finish = &combine<T, SumOp>; break;
    case ReduceOp::Prod: r.combine = r.finish = &combine<T, ProdOp>; break;
    case ReduceOp::Min: r.combine = r.finish = &combine<T, MinOp>; break;
    case ReduceOp::Max: r.combine = r.finish = &combine<T, MaxOp>; break;
    case ReduceOp::Avg:
      r.combine = &combine<T, SumOp>;
      r.finish = &sum_div<T>;
      break;
    default: r = Reducer{}; break;
  }
  return r;
}

}  // namespace

namespace detail::RINGFENCE_REDUCE_VARIANT {

/// This variant's reducer of `type` and `op` (combine/finish and element size only).
Reducer host_reducer_of(DataType type, ReduceOp op) noexcept {
  switch (type) {
    case DataType::Int8: return make<std::int8_t>(op);
    case DataType::Uint8: return make<std::uint8_t>(op);
    case DataType::Int32: return make<std::int32_t>(op);
    case DataType::Uint32: return make<std::uint32_t>(op);
    case DataType::Int64: return make<std::int64_t>(op);
    case DataType::Uint64: return make<std::uint64_t>(op);
#if RINGFENCE_HAVE_F16C
    case DataType::Float16: return make_half(op);
#else
    case DataType::Float16: return make<Half>(op);
#endif
#if defined(__AVX2__)
    case DataType::BFloat16: return make_bf16(op);
#else
    case DataType::BFloat16: return make<BFloat16>(op);
#endif
    case DataType::Float32: return make<float>(op);
    case DataType::Float64: return make<double>(op);
  }
  return Reducer{};
}

/// This variant's `copy_bytes`.
void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__AVX2__)
  // Up to a default pipeline chunk: the vector loop. Larger copies (whole blocks) stay with
  // glibc, whose non-temporal / rep movsb paths avoid reading destination lines first.
  if (n >= kCopyBytesByMemcpy && n <= (std::size_t{256} << 10)) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    std::size_t i = 0;
    for (; i + 128 <= n; i += 128) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
    }
    if (i < n) std::memcpy(d + i, s + i, n - i);  // < 128 bytes: glibc's vector path
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace detail::RINGFENCE_REDUCE_VARIANT
}  // namespace ringfence
