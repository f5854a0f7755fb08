#pragma once
// What the ringfence process group (process_group.cpp) builds on: torch's store seen as a
// ringfence store, the work handle, and dtype/op/tensor checks. Included by process_group.cpp
// only (one translation unit: the torch headers are heavy).

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

namespace ringfence::torch_backend {

/// Adapts torch's c10d store (the one `init_process_group` created: TCPStore, FileStore or
/// HashStore behind a PrefixStore) to `ringfence::Store`, so the communicator exchanges its
/// addresses through torch's own rendezvous and opens no second port.
class C10dStore final : public ringfence::Store {
 public:
  /// `store` must not be null.
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  /// c10d `set`.
  void set(std::string_view key, std::span<const std::byte> value) override {
    const auto* p = reinterpret_cast<const std::uint8_t*>(value.data());
    store_->set(std::string(key), std::vector<std::uint8_t>(p, p + value.size()));
  }

  /// c10d `wait({key}, timeout)` then `get(key)`; a wait that fails becomes `TimeoutError`
  /// naming the key (torch's own message appended).
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override {
    const std::string k(key);
    try {
      store_->wait({k}, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError("torch store: key '" + k + "' not set within " + std::to_string(timeout.count()) +
                         " ms (" + e.what() + ")");
    }
    const std::vector<std::uint8_t> v = store_->get(k);
    Bytes out(v.size());
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size());
    return out;
  }

  /// c10d `add`.
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    return store_->add(std::string(key), delta);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

/// Work handle of one queued operation: completed by the process group's worker thread, with a
/// future (what DDP's reducer and comm hooks wait on) holding the output tensors.
class RingfenceWork final : public c10d::Work {
 public:
  RingfenceWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  /// The output tensors (valid once completed).
  std::vector<at::Tensor> result() override { return outputs_; }
  /// Completes when the worker finished the operation.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  /// Called by the worker: marks the work and its future done (or failed with `error`).
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

namespace {

// torch dtype -> ringfence dtype. Bool travels as Uint8 (sum is refused for it by the caller).
DataType to_rf(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    case at::kHalf: return DataType::Float16;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::Uint8;
    case at::kBool: return DataType::Uint8;
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    default: break;
  }
  TORCH_CHECK(false, "ringfence: unsupported tensor dtype ", t,
              " (supported: float32, float64, float16, bfloat16, int8, uint8, bool, int32, int64)");
}

ReduceOp to_rf(const c10d::ReduceOp& op, at::ScalarType t) {
  const bool is_bool = t == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      TORCH_CHECK(!is_bool, "ringfence: SUM of bool tensors is not supported (use MAX for a logical or)");
      return ReduceOp::Sum;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Prod;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!is_bool, "ringfence: AVG of bool tensors is not supported");
      return ReduceOp::Avg;
    default: break;
  }
  TORCH_CHECK(false, "ringfence: reduce op ", static_cast<int>(op.op_),
              " is not supported (supported: SUM, PRODUCT, MIN, MAX, AVG; not BAND/BOR/BXOR/PREMUL_SUM)");
}

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "ringfence: ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "ringfence: ", what, " is on ", t.device(),
              "; this ringfence backend was built without CUDA and accepts CPU tensors only");
  TORCH_CHECK(t.layout() == at::kStrided, "ringfence: ", what, " must be a dense (strided) tensor");
  TORCH_CHECK(t.is_contiguous(), "ringfence: ", what, " must be contiguous (call .contiguous())");
  (void)to_rf(t.scalar_type());
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "ringfence: ", what, " must hold exactly one tensor per process (got ",
              ts.size(), ")");
  check_tensor(ts[0], what);
  return ts[0];
}

void same_shape(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "ringfence: ", what, ": dtype ", b.scalar_type(),
              " differs from ", a.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), "ringfence: ", what, ": ", b.numel(), " elements, expected ", a.numel());
}

std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

}  // namespace

}  // namespace ringfence::torch_backend
