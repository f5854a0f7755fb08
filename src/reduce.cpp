// Host reduction kernels. Compiled with -O3 (and -march=${RINGFENCE_ARCH}) so the element loops
// in reduce_ops.hpp vectorise; this is the only place the element-type templates are
// instantiated for the host, 10 types x 5 ops.
#include <ringfence/reduce_ops.hpp>

namespace ringfence {
namespace {

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
    case DataType::Float16: return make<Half>(op);
    case DataType::BFloat16: return make<BFloat16>(op);
    case DataType::Float32: return make<float>(op);
    case DataType::Float64: return make<double>(op);
  }
  return Reducer{};
}

}  // namespace ringfence
