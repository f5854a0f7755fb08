#pragma once
// The liveness heartbeat (CommOptions::heartbeat_interval, docs/failure-semantics.md): a lane
// of its own (one link per peer that only this part's thread drives: the SPI's one-thread
// rule) on which every rank beats and watches the others. On the beat lane, data[p] counts p's
// beats, credit[p] = 1 says p closed its communicator, and the abort word carries an abort() of
// a peer. A peer that dies, stops or aborts is reported through `OnLost`; one that closes
// cleanly is remembered (collectives need every rank, point-to-point between others goes on).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <ringfence/log.hpp>
#include <string>
#include <thread>
#include <vector>

#include "lane.hpp"

namespace ringfence::detail {

class Heartbeat {
 public:
  /// Called on the heartbeat's thread when a peer is lost: the peer (or the rank that aborted),
  /// the error class and a sentence saying why. Must not throw.
  using OnLost = std::function<void(int peer, ErrorCode code, const std::string& why)>;

  /// Beats every `period`; a peer silent for `timeout` is lost.
  Heartbeat(int rank, int size, std::chrono::milliseconds period, std::chrono::milliseconds timeout, const Logger& log,
            OnLost on_lost);
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  /// The beat lane: its connections are made and connected by the caller before `start()`.
  LaneState& lane() noexcept { return lane_; }
  /// Starts the thread.
  void start();
  /// Says goodbye to every peer and joins the thread. Idempotent; never throws.
  void stop() noexcept;
  /// abort(): tells the peers on the next beat (before any goodbye). Any thread.
  void request_abort() noexcept;
  /// Fences and drops the beat lane's links (teardown, after `stop`).
  void close(FenceReason why) noexcept;

  /// The peer whose heartbeat is the most overdue, if one is silent for more than three periods
  /// and a quarter of the timeout (the likely end of a chain of ranks waiting on each other),
  /// with its silence in `age_ms`; -1 = none (or the heartbeat is off). Any thread.
  int silent_peer(std::int64_t& age_ms) const noexcept;
  /// "; rank R has sent no heartbeat for N ms" for `silent_peer`, or empty.
  std::string silent_peer_note() const;
  /// Whether some peer closed its communicator (lock-free). Any thread.
  bool any_left() const noexcept { return peers_left_.load(std::memory_order_acquire) > 0; }
  /// The peers that closed their communicators. Any thread.
  std::vector<int> left_ranks() const;

 private:
  void loop() noexcept;
  static std::int64_t now_ns() noexcept;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds period_;
  const std::chrono::milliseconds timeout_;
  const Logger& log_;
  const OnLost on_lost_;
  LaneState lane_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool abort_requested_ = false;
  // Per rank: steady-clock time (ns) its heartbeat last advanced; and whether it closed its
  // communicator. Read by other threads (silent_peer, left_ranks).
  std::unique_ptr<std::atomic<std::int64_t>[]> seen_ns_;
  std::unique_ptr<std::atomic<bool>[]> left_;
  std::atomic<int> peers_left_{0};
  std::atomic<bool> started_{false};  // start() ran (silent_peer from other threads)
};

}  // namespace ringfence::detail
