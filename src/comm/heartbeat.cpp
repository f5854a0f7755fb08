#include "heartbeat.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace ringfence::detail {

Heartbeat::Heartbeat(int rank, int size, std::chrono::milliseconds period, std::chrono::milliseconds timeout, const Logger& log,
                     OnLost on_lost)
    : rank_(rank), size_(size), period_(period), timeout_(timeout), log_(log), on_lost_(std::move(on_lost)) {
  // Value-initialised: every rank's time 0 (start() sets it), nobody left.
  seen_ns_ = std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(size));
  left_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(size));
}

std::int64_t Heartbeat::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Heartbeat::start() {
  const std::int64_t start = now_ns();
  for (int r = 0; r < size_; ++r) seen_ns_[static_cast<std::size_t>(r)].store(start);
  thread_ = std::thread([this] { loop(); });
  started_.store(true, std::memory_order_release);
}

void Heartbeat::stop() noexcept {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::request_abort() noexcept {
  {
    std::lock_guard lock(mutex_);
    abort_requested_ = true;
  }
  cv_.notify_all();
}

void Heartbeat::close(FenceReason why) noexcept {
  for (auto& ch : lane_.connections)
    if (ch->link) ch->link->fence(why);
  lane_.connections.clear();
}

void Heartbeat::loop() noexcept {
  try {
    std::vector<std::uint32_t> seen(static_cast<std::size_t>(size_), 0);
    std::vector<std::chrono::steady_clock::time_point> changed(static_cast<std::size_t>(size_), std::chrono::steady_clock::now());
    std::vector<char> watched(static_cast<std::size_t>(size_), 1);
    std::uint32_t beat = 0;
    bool abort_sent = false, abort_seen = false;
    auto left_cleanly = [&](const Connection& ch) {
      const auto p = static_cast<std::size_t>(ch.peer);
      watched[p] = 0;
      left_[p].store(true, std::memory_order_release);
      peers_left_.fetch_add(1, std::memory_order_acq_rel);
      log_.info("rank {} closed its communicator", ch.peer);
    };
    auto last_sweep = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    for (;;) {
      const bool stop = stop_;
      // This thread itself may not have run for a while (an overloaded host): silence is
      // only judged over time it was awake to see beats arrive.
      if (const auto now = std::chrono::steady_clock::now(); now - last_sweep > timeout_ / 2)
        std::fill(changed.begin(), changed.end(), now);
      last_sweep = std::chrono::steady_clock::now();
      const bool send_abort = abort_requested_ && !abort_sent;
      lock.unlock();
      ++beat;
      for (auto& chp : lane_.connections) {
        Connection& ch = *chp;
        const auto p = static_cast<std::size_t>(ch.peer);
        const std::size_t word = stop ? FlagBlock::credit_offset(size_, rank_) : FlagBlock::data_offset(size_, rank_);
        Status s = Status::ok();
        if (send_abort)  // before a goodbye: the peer must learn that we aborted, not that we left
          s = ch.link->signal(
              SignalOp{&ch.peer_flags, FlagBlock::abort_offset(size_), FlagBlock::abort_value(ErrorCode::Aborted, rank_, -1), 0});
        if (s.is_ok()) s = ch.link->signal(SignalOp{&ch.peer_flags, word, stop ? 1u : beat, 0});
        for (;;) {  // completions carry nothing we need; keep the queue empty
          Completion done[8];
          std::size_t n = 0;
          if (!ch.link->poll(done, n).is_ok() || n < std::size(done)) break;
        }
        if (stop || !watched[p]) continue;
        const FlagBlock& in = lane_.flags;
        if (!abort_seen)
          if (const std::uint32_t a = in.abort->value.load(std::memory_order_acquire); a != 0) {
            abort_seen = true;
            const int reporter = abort_failure(a, "", 0).peer;
            on_lost_(reporter, ErrorCode::PeerUnreachable, fmt::format("rank {} aborted the communicator (abort())", reporter));
          }
        if (in.credit[p].value.load(std::memory_order_acquire) != 0) {
          // A clean goodbye: not a failure (point-to-point between the others goes on), but
          // collectives need every rank (the communicator refuses them from now on).
          left_cleanly(ch);
          continue;
        }
        const auto now = std::chrono::steady_clock::now();
        const std::uint32_t v = in.data[p].value.load(std::memory_order_acquire);
        if (v != seen[p]) {
          seen[p] = v;
          changed[p] = now;
          seen_ns_[p].store(now_ns(), std::memory_order_relaxed);
        }
        // Ask the transport whether the peer is still there (shm: its pidfd) only when its
        // beats are late: the check spins first, which costs a busy host dearly.
        if (s.is_ok() && now - changed[p] > 2 * period_) s = ch.link->wait(in.data[p], v + 1, std::chrono::nanoseconds(0));
        // A peer that closes cleanly says goodbye first, but a transport with several sockets
        // per link may see one socket's end before the goodbye read from another: give it a
        // moment before calling the peer gone.
        for (int i = 0; s.is_error() && i < 20 && in.credit[p].value.load(std::memory_order_acquire) == 0; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (s.is_error() && in.credit[p].value.load(std::memory_order_acquire) != 0) {
          left_cleanly(ch);
          continue;
        }
        if (s.is_error()) {
          watched[p] = 0;
          on_lost_(ch.peer, ErrorCode::PeerUnreachable,
                   fmt::format("rank {} is unreachable: its heartbeat link ({}) reports it gone (process exited or killed?)", ch.peer,
                               ch.transport_name));
        } else if (now - changed[p] > timeout_) {
          watched[p] = 0;
          on_lost_(ch.peer, ErrorCode::Timeout,
                   fmt::format("rank {} sent no heartbeat for {} ms over {} (process stopped, hung or cut off?)", ch.peer,
                               std::chrono::duration_cast<std::chrono::milliseconds>(now - changed[p]).count(), ch.transport_name));
        }
      }
      if (send_abort) abort_sent = true;
      lock.lock();
      if (stop) return;
      cv_.wait_for(lock, period_, [&] { return stop_ || (abort_requested_ && !abort_sent); });
    }
  } catch (const std::exception& e) {  // formatting only; the loop itself does not throw
    log_.error("heartbeat thread stopped: {}", e.what());
  }
}

int Heartbeat::silent_peer(std::int64_t& age_ms) const noexcept {
  if (!started_.load(std::memory_order_acquire)) return -1;
  const std::int64_t now = now_ns();
  const auto period_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(period_).count();
  const auto quarter_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count() / 4;
  int worst = -1;
  std::int64_t worst_age = std::max<std::int64_t>(3 * period_ns, quarter_ns);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || left_[static_cast<std::size_t>(r)].load()) continue;
    const std::int64_t age = now - seen_ns_[static_cast<std::size_t>(r)].load(std::memory_order_relaxed);
    if (age > worst_age) worst = r, worst_age = age;
  }
  age_ms = worst_age / 1000000;
  return worst;
}

std::string Heartbeat::silent_peer_note() const {
  std::int64_t age_ms = 0;
  const int worst = silent_peer(age_ms);
  return worst < 0 ? std::string() : fmt::format("; rank {} has sent no heartbeat for {} ms", worst, age_ms);
}

std::vector<int> Heartbeat::left_ranks() const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && left_[static_cast<std::size_t>(r)].load(std::memory_order_acquire)) out.push_back(r);
  return out;
}

}  // namespace ringfence::detail
