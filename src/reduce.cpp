// Host reduction kernels. Compiled with -O3 (and -march=${RINGFENCE_ARCH}) so the element loops
// in reduce_ops.hpp vectorise; this is the only place the element-type templates are
// instantiated for the host, 10 types x 5 ops.
#include <cstring>
#include <ringfence/reduce_ops.hpp>

#if defined(__AVX__)
#include <immintrin.h>
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

Reducer host_reducer(DataType type, ReduceOp op) noexcept {
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
    case DataType::BFloat16: return make<BFloat16>(op);
    case DataType::Float32: return make<float>(op);
    case DataType::Float64: return make<double>(op);
  }
  return Reducer{};
}

void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__AVX2__)
  if (n >= 512) {
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

}  // namespace ringfence
