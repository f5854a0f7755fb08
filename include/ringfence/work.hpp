#pragma once
/// \file work.hpp
/// `Work`: the handle of an asynchronous collective (`Communicator::*_async`). Its own header so
/// that code which queues work (the communicator's progress thread, the stream-ordered stager)
/// needs nothing of the communicator itself.

#include <chrono>
#include <memory>

namespace ringfence {

/// Handle of an asynchronous collective. Copyable; every copy refers to the same work. A
/// default-constructed handle is complete.
class Work {
 public:
  Work() = default;
  /// True once the work finished (successfully or not). Never blocks or throws.
  bool test() const noexcept;
  /// Blocks until the work finished; rethrows its error (the same exception types as the
  /// blocking call). Bounded: the collective's own waits time out.
  void wait() const;
  /// Like `wait()`, but returns false if the work is still running after `timeout`.
  bool wait_for(std::chrono::nanoseconds timeout) const;

  struct State;  ///< shared completion state (private)
  /// Wraps a state (used by the communicator).
  explicit Work(std::shared_ptr<State> state) noexcept : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ringfence
