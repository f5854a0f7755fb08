#pragma once
// The lanes of a communicator (lane.hpp): choosing a transport per peer, building and connecting
// lanes (lane 0, the extra lanes of RINGFENCE_CHANNELS, and the heartbeat's and device lane's
// when their parts ask), replacing one connection's link (`connect_connection`, used at setup and by a
// link move alike), the memory the lanes and `alloc()` hand out, wiring the lanes to a plan,
// and running one split collective's slices on the lane worker threads.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "context.hpp"
#include "lane.hpp"
#include "plan_state.hpp"

namespace ringfence {
struct LinkInfo;
}

namespace ringfence::detail {

/// Store-key index of the heartbeat's lane and of the device lane (`Lanes::connect`).
inline constexpr int kBeatLane = -1;
inline constexpr int kDeviceLane = -2;

/// One extra lane's share of a split collective.
struct LaneJob {
  RingCall call;
  const Reducer* reducer = nullptr;
  DirectWrite direct;
  Failure failure;
  Status status;
};

class Lanes {
 public:
  explicit Lanes(CommContext& ctx) : ctx_(ctx) {}
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;
  ~Lanes() { stop_workers(); }

  // ---- setup (may block, allocate, throw) ----
  /// Makes lane 0's connection to every peer and gives each the first (highest priority) selected
  /// transport that reaches it: both ends evaluate the same list on the same facts, so they
  /// agree. Returns the largest chunk preference of the chosen transports. Throws
  /// `Error(PeerUnreachable)` naming every transport's reason when none reaches a peer.
  std::size_t choose_transports();
  /// Whether a transport lane 0 chose (choose_transports) reaches some peer over a network
  /// (does not share memory): tcp or verbs across hosts, or ahead of shm in
  /// RINGFENCE_TRANSPORTS on one host. This rank's own links; other ranks may differ.
  bool has_network_link() const noexcept;
  /// Lanes to build: RINGFENCE_CHANNELS, or (0 = auto) one per core this rank can count on
  /// (online cores over the ranks on this host), at most 4.
  int lane_count() const;
  /// Gives `L` a connection to every peer of lane 0 over the same transport (the extra lanes', the
  /// heartbeat's); `expected`: with the transports' bandwidth figures.
  void follow_lane0(LaneState& L, bool expected) const;
  /// Connects lane `index` of `L` (its connections name peer and transport): allocates its
  /// flags, staging slots and scratch (`memory` Device: staging and scratch in device memory from
  /// the connections' transports, plus one slot after the scratch, returned in `*extra_slot`),
  /// then connects every connection (`connect_connection`), checking that every peer runs the
  /// same data-path options (`CommContext::protocol`).
  void connect(LaneState& L, int index, MemoryKind memory = MemoryKind::Host, std::byte** extra_slot = nullptr);
  /// Connects lane 0 and `count - 1` extra lanes and starts the extra lanes' workers.
  void build(int count);
  /// Connects `ch` of lane `L` over `to`, at setup and for a link move alike: an old link is
  /// fenced and dropped, the two ends meet in the store under `key` (listen address, then region
  /// keys and protocol), and the lane's flags and `ch`'s staging slots (`inbox_kind` memory) are
  /// registered with the new link, so the signal words keep their values and the connection its
  /// message counters. `what` starts the error ("rank 0: connecting to rank 1 over tcp"). Throws
  /// on a timeout, a refused connection or different data-path options.
  void connect_connection(LaneState& L, Connection& ch, Transport& to, const std::string& key, MemoryKind inbox_kind,
                          const std::string& what);
  /// One connection to (re)connect: over `to`, meeting the peer under store key `key`; `what`
  /// starts its errors.
  struct ConnectSpec {
    Connection* ch;
    Transport* to;
    std::string key;
    std::string what;
  };
  /// `connect_connection` for several connections of `L` at once, in phases that each set
  /// every store key before reading any (as a collective-only store needs, src/mpi_store.cpp).
  void connect_connections(LaneState& L, std::span<const ConnectSpec> specs, MemoryKind inbox_kind);

  // ---- memory ----
  /// Host memory shared with peers where a transport can (else the heap), freed at teardown.
  void* allocate(std::size_t bytes);
  /// Device memory from `t`, freed at teardown. Throws `CudaError` when it has none.
  std::byte* allocate_device(Transport& t, std::size_t bytes);
  /// `alloc()`: like `allocate`, remembered as the user's.
  void* user_alloc(std::size_t bytes);
  /// `free()`: false when `ptr` is not from `user_alloc`.
  bool user_free(void* ptr) noexcept;
  /// True when `ptr` is the start of an allocation from `user_alloc`.
  bool owns_user_allocation(const void* ptr) const noexcept;
  /// True when [ptr, ptr+bytes) lies in memory from `user_alloc` (shareable without copies).
  bool is_user_memory(const void* ptr, std::size_t bytes) const noexcept;

  // ---- the plan ----
  /// Wires every host lane to `plan`: left and right neighbours, relay duties, ring position;
  /// lane 0's per-position connection table. Between collectives only.
  void wire(const PlanState& plan);
  /// Lane 0's connection per rank and per ring position (null for ourselves).
  Connection* const* by_rank() const noexcept { return connection_of_.data(); }
  Connection* const* by_position() const noexcept { return position_connection_.data(); }

  // ---- lanes ----
  LaneState& main() noexcept { return lane0_; }
  const LaneState& main() const noexcept { return lane0_; }
  LaneState& lane(int l) noexcept { return l == 0 ? lane0_ : *extra_[static_cast<std::size_t>(l - 1)]; }
  /// Host lanes built (1 + extra).
  int count() const noexcept { return 1 + static_cast<int>(extra_.size()); }
  /// Every host lane, lane 0 first.
  template <class F>
  void for_each(F&& f) {
    f(lane0_);
    for (auto& l : extra_) f(*l);
  }
  /// The same plus the device lane once attached (aborts, timeouts, teardown).
  template <class F>
  void for_each_and_device(F&& f) {
    for_each(f);
    if (LaneState* d = device_.load(std::memory_order_acquire)) f(*d);
  }
  /// Publishes the device lane (complete) to other threads.
  void attach_device(LaneState* lane) noexcept { device_.store(lane, std::memory_order_release); }
  /// Ends this rank's in-flight work: every lane's own abort word gets `value`. Any thread.
  void local_abort(std::uint32_t value) noexcept;
  /// Tells every peer on every lane but `skip` (best effort). Never throws.
  void abort_peers(std::uint32_t value, int skip = -1) noexcept;
  /// The link table (`links()`): safe against a move replacing a link. Any thread.
  std::vector<LinkInfo> links() const;
  /// Guards each connection's `link` and `transport_name` where a move replaces them, against
  /// `links()` from other threads; the communicator's own thread reads them without it.
  std::mutex& links_mutex() const noexcept { return links_mutex_; }

  // ---- split collectives ----
  LaneJob& job(int l) noexcept { return jobs_[static_cast<std::size_t>(l)]; }
  /// Runs jobs [0, lanes) at once: lane 0's on this thread, the others on their workers. A lane
  /// that fails stops its siblings through their local abort words (bounded: every wait checks
  /// it), so no lane outlives the call by more than one wait slice.
  void run_jobs(int lanes);

  // ---- teardown ----
  void stop_workers() noexcept;
  /// Fences every link (lanes and device lane) with `why`.
  void fence_all(FenceReason why) noexcept;
  /// Drops every lane's connections (links, then regions, before the memory they describe).
  void drop_connections() noexcept;
  /// Frees every allocation, newest first.
  void release_memory() noexcept;

 private:
  void finish_connect(PendingLink& pending, Connection& ch, std::chrono::steady_clock::time_point deadline, const std::string& what);
  void run_job(int l) noexcept;
  void start_workers();

  CommContext& ctx_;
  LaneState lane0_;
  std::vector<std::unique_ptr<LaneState>> extra_;  // lanes 1.. (RINGFENCE_CHANNELS > 1)
  std::atomic<LaneState*> device_{nullptr};
  std::vector<Connection*> connection_of_;        // lane 0's, by rank
  std::vector<Connection*> position_connection_;  // lane 0's, by ring position
  // Internal memory (flags, inboxes, scratch) and user allocations: pointer -> allocating
  // transport (nullptr = plain heap).
  std::vector<std::pair<void*, Transport*>> allocations_;
  std::vector<std::pair<std::uintptr_t, std::size_t>> user_allocs_;
  mutable std::mutex links_mutex_;
  // Lane workers: lane l >= 1 runs jobs_[l] when round_ moves and l < in_use_.
  std::vector<LaneJob> jobs_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::uint64_t round_ = 0;
  int in_use_ = 1;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace ringfence::detail
