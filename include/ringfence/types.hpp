#pragma once
/// \file types.hpp
/// Element types, reduction operators and memory kinds understood by every collective.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ringfence/config.hpp>
#include <string_view>

namespace ringfence {

/// Element type of a collective's buffers. Values are stable (used on the wire in call
/// fingerprints) and dense from 0, so they index tables.
enum class DataType : std::uint8_t {
  Int8 = 0,
  Uint8,
  Int32,
  Uint32,
  Int64,
  Uint64,
  Float16,   ///< IEEE 754 binary16; reductions accumulate in float and round once per step
  BFloat16,  ///< bfloat16; reductions accumulate in float and round once per step
  Float32,
  Float64,
};

/// Number of `DataType` values.
inline constexpr int kNumDataTypes = 10;

/// Reduction operator. `Avg` is a sum followed by a division by the number of ranks
/// (integer division for integer types), applied once per element by the element's owner.
enum class ReduceOp : std::uint8_t { Sum = 0, Prod, Min, Max, Avg };

/// Number of `ReduceOp` values.
inline constexpr int kNumReduceOps = 5;

/// Where a buffer lives.
enum class MemoryKind : std::uint8_t {
  Host = 0,  ///< ordinary or shared host memory
  Device,    ///< CUDA device memory
};

/// A CUDA stream (`cudaStream_t`) handed over without CUDA headers: `CudaStream{stream}`.
/// The null handle is the legacy default stream.
struct CudaStream {
  void* handle = nullptr;  ///< the cudaStream_t value
};

/// Size in bytes of one element of `type`. Returns 0 for an out-of-range value.
RINGFENCE_HOST_DEVICE constexpr std::size_t size_of(DataType type) noexcept {
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8: return 1;
    case DataType::Float16:
    case DataType::BFloat16: return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32: return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64: return 8;
  }
  return 0;
}

/// True when `type` is one of the declared enumerators (guards values cast from integers).
constexpr bool is_valid(DataType type) noexcept { return static_cast<int>(type) < kNumDataTypes; }
/// True when `op` is one of the declared enumerators.
constexpr bool is_valid(ReduceOp op) noexcept { return static_cast<int>(op) < kNumReduceOps; }

/// True for float16, bfloat16, float32 and float64.
constexpr bool is_floating(DataType type) noexcept {
  return type == DataType::Float16 || type == DataType::BFloat16 || type == DataType::Float32 ||
         type == DataType::Float64;
}

/// nccl-tests style short name: "int8", "uint8", "int32", "uint32", "int64", "uint64",
/// "half", "bfloat16", "float", "double".
std::string_view to_string(DataType type) noexcept;
/// "sum", "prod", "min", "max", "avg".
std::string_view to_string(ReduceOp op) noexcept;
/// "host" or "device".
std::string_view to_string(MemoryKind kind) noexcept;

/// Parses a data type name. Accepts the names of `to_string` plus common aliases
/// ("float16", "fp16", "bf16", "float32", "fp32", "float64", "fp64", "int", "uint").
std::optional<DataType> parse_data_type(std::string_view name) noexcept;
/// Parses "sum", "prod", "min", "max", "avg".
std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept;

}  // namespace ringfence
