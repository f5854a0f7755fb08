#pragma once
// The communicator's progress thread: queued closures run one after another in issue order,
// each completing the `Work` handed out for it. The thread starts with the first queued closure
// (a communicator that never makes an asynchronous call never has one) and is joined by `stop()`.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <ringfence/work.hpp>
#include <thread>
#include <utility>

namespace ringfence {

// Completion state shared by every copy of a `Work`.
struct Work::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) noexcept;
};

namespace detail {

class AsyncQueue {
 public:
  AsyncQueue() = default;
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;
  /// Joins the thread after the queued closures ran (see `stop`).
  ~AsyncQueue() { stop(); }

  /// Queues `run` (starting the thread if needed) and returns the Work it completes: an exception
  /// `run` throws becomes the Work's error.
  Work push(std::function<void()> run);
  /// Waits until every queued closure finished. A no-op when nothing was ever queued. Bounded
  /// because each closure is (every collective's waits time out).
  void drain();
  /// Lets the queued closures finish, then joins the thread. Idempotent; never throws.
  void stop() noexcept;

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;  // work queued, or the queue drained
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Work::State>>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace detail
}  // namespace ringfence
