#include "async_queue.hpp"

namespace ringfence {

void Work::State::finish(std::exception_ptr e) noexcept {
  {
    std::lock_guard lock(mutex);
    done = true;
    error = std::move(e);
  }
  cv.notify_all();
}

bool Work::test() const noexcept {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

bool Work::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) return true;
  std::unique_lock lock(state_->mutex);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) return false;
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

void Work::wait() const {
  if (!state_) return;
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

namespace detail {

Work AsyncQueue::push(std::function<void()> run) {
  auto state = std::make_shared<Work::State>();
  std::lock_guard lock(mutex_);
  if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  queue_.emplace_back(std::move(run), state);
  cv_.notify_all();
  return Work(std::move(state));
}

void AsyncQueue::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop requested and nothing left
    auto [run, state] = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      run();
    } catch (...) {
      error = std::current_exception();
    }
    state->finish(error);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void AsyncQueue::drain() {
  // Only the owner's thread starts the worker (push), and it is the one that drains: reading
  // joinable() without the lock is safe.
  if (!worker_.joinable()) return;
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void AsyncQueue::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace detail
}  // namespace ringfence
