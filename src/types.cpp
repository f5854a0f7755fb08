#include <ringfence/types.hpp>
#include <string>

namespace ringfence {

std::string_view to_string(DataType type) noexcept {
  switch (type) {
    case DataType::Int8: return "int8";
    case DataType::Uint8: return "uint8";
    case DataType::Int32: return "int32";
    case DataType::Uint32: return "uint32";
    case DataType::Int64: return "int64";
    case DataType::Uint64: return "uint64";
    case DataType::Float16: return "half";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Float32: return "float";
    case DataType::Float64: return "double";
  }
  return "invalid";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
  }
  return "invalid";
}

std::string_view to_string(MemoryKind kind) noexcept {
  return kind == MemoryKind::Host ? "host" : kind == MemoryKind::Device ? "device" : "invalid";
}

std::optional<DataType> parse_data_type(std::string_view name) noexcept {
  struct Alias {
    std::string_view name;
    DataType type;
  };
  static constexpr Alias kAliases[] = {
      {"int8", DataType::Int8},       {"char", DataType::Int8},         {"uint8", DataType::Uint8},
      {"int32", DataType::Int32},     {"int", DataType::Int32},         {"uint32", DataType::Uint32},
      {"uint", DataType::Uint32},     {"int64", DataType::Int64},       {"uint64", DataType::Uint64},
      {"half", DataType::Float16},    {"float16", DataType::Float16},   {"fp16", DataType::Float16},
      {"bfloat16", DataType::BFloat16}, {"bf16", DataType::BFloat16},   {"float", DataType::Float32},
      {"float32", DataType::Float32}, {"fp32", DataType::Float32},      {"double", DataType::Float64},
      {"float64", DataType::Float64}, {"fp64", DataType::Float64},
  };
  for (const Alias& a : kAliases)
    if (a.name == name) return a.type;
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept {
  for (int i = 0; i < kNumReduceOps; ++i) {
    const auto op = static_cast<ReduceOp>(i);
    if (to_string(op) == name) return op;
  }
  return std::nullopt;
}

}  // namespace ringfence
