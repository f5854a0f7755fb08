#include "reduce_kernels.cuh"

namespace ringfence::cuda {
namespace {

template <class T, class Op>
cudaError_t launch(void* dst, const void* a, const void* b, std::size_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  reduce_kernel<T, Op><<<reduce_blocks(n, sizeof(T)), 256, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                                           static_cast<const T*>(b), n, op);
  return cudaGetLastError();
}

template <DataType D>
cudaError_t dispatch_op(ReduceOp op, bool finish, int divisor, void* dst, const void* a, const void* b, std::size_t n,
                        cudaStream_t stream) {
  using T = typename StorageOf<D>::type;
  switch (op) {
    case ReduceOp::Sum: return launch<T>(dst, a, b, n, SumOp<T>{}, stream);
    case ReduceOp::Prod: return launch<T>(dst, a, b, n, ProdOp<T>{}, stream);
    case ReduceOp::Min: return launch<T>(dst, a, b, n, MinOp<T>{}, stream);
    case ReduceOp::Max: return launch<T>(dst, a, b, n, MaxOp<T>{}, stream);
    case ReduceOp::Avg:
      return finish ? launch<T>(dst, a, b, n, SumDivOp<T>{divisor}, stream) : launch<T>(dst, a, b, n, SumOp<T>{}, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T, class Op>
cudaError_t load() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, reduce_kernel<T, Op>);
}

template <DataType D>
cudaError_t load_type() {
  using T = typename StorageOf<D>::type;
  for (cudaError_t err : {load<T, SumOp<T>>(), load<T, ProdOp<T>>(), load<T, MinOp<T>>(), load<T, MaxOp<T>>(), load<T, SumDivOp<T>>()})
    if (err != cudaSuccess) return err;
  return cudaSuccess;
}

}  // namespace

cudaError_t preload_kernels() {
  for (cudaError_t err : {load_type<DataType::Int8>(), load_type<DataType::Uint8>(), load_type<DataType::Int32>(),
                          load_type<DataType::Uint32>(), load_type<DataType::Int64>(), load_type<DataType::Uint64>(),
                          load_type<DataType::Float16>(), load_type<DataType::BFloat16>(), load_type<DataType::Float32>(),
                          load_type<DataType::Float64>()})
    if (err != cudaSuccess) return err;
  return cudaSuccess;
}

cudaError_t launch_combine(DataType type, ReduceOp op, bool finish, int divisor, void* dst, const void* a, const void* b,
                           std::size_t n, cudaStream_t stream) {
  if (op == ReduceOp::Avg && finish && divisor <= 0) return cudaErrorInvalidValue;
  switch (type) {
    case DataType::Int8: return dispatch_op<DataType::Int8>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Uint8: return dispatch_op<DataType::Uint8>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Int32: return dispatch_op<DataType::Int32>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Uint32: return dispatch_op<DataType::Uint32>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Int64: return dispatch_op<DataType::Int64>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Uint64: return dispatch_op<DataType::Uint64>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Float16: return dispatch_op<DataType::Float16>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::BFloat16: return dispatch_op<DataType::BFloat16>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Float32: return dispatch_op<DataType::Float32>(op, finish, divisor, dst, a, b, n, stream);
    case DataType::Float64: return dispatch_op<DataType::Float64>(op, finish, divisor, dst, a, b, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ringfence::cuda
