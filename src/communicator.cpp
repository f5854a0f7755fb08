// Communicator: setup (control plane: may block, allocate, throw) and the API boundary that
// validates arguments, runs the executor (which returns Status) and turns failures into
// exceptions naming the rank, peer and link.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/plan.hpp>
#include <ringfence/log.hpp>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/tuner.hpp>
#include <thread>

#include "cuda_api.hpp"
#include "device_kernels.hpp"
#include "device_staging.hpp"
#include "engine.hpp"
#include "health_monitor.hpp"
#include <ringfence/health/topology.hpp>

namespace ringfence {

namespace {

std::string default_host_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return boot.empty() ? std::string(host) : fmt::format("{}/{}", host, boot);
}

// Frames several byte strings into one store value: u32 count, then (u32 length, bytes)*.
Bytes pack(const std::vector<Bytes>& parts) {
  Bytes out;
  auto put32 = [&](std::uint32_t v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + 4);
  };
  put32(static_cast<std::uint32_t>(parts.size()));
  for (const auto& p : parts) {
    put32(static_cast<std::uint32_t>(p.size()));
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

std::vector<Bytes> unpack(std::span<const std::byte> in, std::string_view what) {
  auto get32 = [&](std::size_t& pos) {
    RINGFENCE_EXPECTS(in.size() - pos >= 4, "malformed {} in the bootstrap store", what);
    std::uint32_t v;
    std::memcpy(&v, in.data() + pos, 4);
    pos += 4;
    return v;
  };
  std::size_t pos = 0;
  const std::uint32_t n = get32(pos);
  RINGFENCE_EXPECTS(n <= 64, "malformed {} in the bootstrap store", what);
  std::vector<Bytes> parts;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t len = get32(pos);
    RINGFENCE_EXPECTS(in.size() - pos >= len, "malformed {} in the bootstrap store", what);
    parts.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  return parts;
}

}  // namespace

struct Work::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(mutex);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

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

HealthSnapshot snapshot_of(const Communicator::Impl& m);
std::vector<LinkInfo> links_of(const Communicator::Impl& m);

// One channel set ("lane"): the flag block, a channel (link, staging slots, counters) to every
// peer, scratch, and the engine configuration that goes with them. Lane 0 is the
// communicator's own: every call runs on it. With several channels (RINGFENCE_CHANNELS) large
// ring collectives are split into slices, one per lane, run at once by lane worker threads;
// each lane has its own connections, so lanes never share a link or a flag word.
struct LaneState {
  detail::EngineConfig engine;
  detail::FlagBlock flags;
  std::vector<std::unique_ptr<detail::Channel>> channels;
  detail::Channel* left = nullptr;
  detail::Channel* right = nullptr;
  detail::RelayDuties relay_duties;  // the relays this rank forwards for
  void* flags_mem = nullptr;
  void* inbox_mem = nullptr;
  void* scratch_mem = nullptr;  // partial results in flight (engine.scratch)

  detail::Channel& channel_to(int peer) {
    for (auto& ch : channels)
      if (ch->peer == peer) return *ch;
    channels.push_back(std::make_unique<detail::Channel>());
    channels.back()->peer = peer;
    return *channels.back();
  }
};

// Work for one extra lane in one split collective.
struct LaneJob {
  detail::RingCall call;
  const Reducer* reducer = nullptr;
  detail::DirectWrite direct;
  detail::Failure failure;
  Status status;
};

struct Communicator::Impl : LaneState {
  CommOptions options;
  Logger log;
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::shared_ptr<TcpStoreServer> server;  // when this rank hosts the store (shared with shrunk communicators)
  TransportRegistry registry;              // what setup() used (shrink builds from it again)
  std::uint64_t shrinks = 0;               // shrink() calls so far (store namespace of the next)
  std::uint64_t splits = 0;                // split() calls so far (store namespace of the next)
  PeerInfo self;
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<LaneState>> extra_lanes;  // lanes 1.. (RINGFENCE_CHANNELS > 1)
  int planned_lanes = 1;                                // lanes built at setup (1 + extra_lanes)
  std::vector<int> ring;        // current ring order
  std::vector<int> home_ring;   // the unfenced plan: each host's ranks contiguous (see setup)
  TunerModel tuner_model;       // options' alpha-beta, or inter-host figures when hosts > 1
  // Inter-host hops (tcp over a 10 GbE-class network): the model's per-hop cost and bandwidth.
  static constexpr double kInterHostAlphaUs = 25.0;
  static constexpr double kInterHostGbps = 1.25;
  std::vector<LinkId> fenced;   // agreed fenced links
  std::vector<LinkId> unroutable;  // links that must be fenced but no plan avoids: in use, checksummed
  std::vector<Relay> relays;    // fenced ring hops carried through a third rank
  std::uint64_t epoch = 0;      // +1 per re-plan
  EventCallback event_callback;
  std::uint64_t digest_mismatch_count = 0;
  std::vector<std::uint8_t> votes;      // fence proposals, n x n, then fallbacks, n x n; sized at setup
  std::vector<PeerInfo> peer_info;      // by rank, ourselves included (what setup learned; moves reconnect with it)
  int nvml_gpu = -1;                    // NVML index of this rank's GPU (`health_gpu` resolved at setup); -1 = unknown
  std::vector<int> fallback_of;         // by rank: index in `transports` our link to it may move to, -1 = none
  std::vector<std::uint64_t> digests;   // result digests, n; sized at setup
  std::unique_ptr<detail::HealthMonitor> monitor;  // with checksums or a link map: the links' policies
  std::vector<detail::TransportObservation> observations;  // per agreement; sized at setup
  std::vector<std::pair<std::uint64_t, std::uint64_t>> timed;  // per peer: timed bytes, ns (per agreement)
  // Bandwidth evidence needs at least this much timed traffic on a link between agreements.
  static constexpr std::uint64_t kBandwidthEvidenceBytes = 1 << 20;

  bool agreement_enabled() const noexcept {
    return size > 1 && options.health_agree_every > 0 && (engine.checksum || (monitor && monitor->active()));
  }

  // Result digest (design §5 "Integrity"): every rank puts crc32c(output) in its slot of an
  // n-vector, a max-allreduce gives everyone all digests, and the ranks that differ from the
  // majority are named. Same inputs everywhere, so every rank reports the same ranks.
  Status compare_digests(const void* out, std::size_t bytes, detail::Failure& failure) {
    std::fill(digests.begin(), digests.end(), std::uint64_t{0});
    digests[static_cast<std::size_t>(rank)] = (std::uint64_t{1} << 32) | crc32c(out, bytes);  // bit 32: present
    detail::EngineConfig config = engine;
    config.checksum = true;
    const Reducer max = host_reducer(DataType::Uint64, ReduceOp::Max);
    RINGFENCE_TRY(detail::run_ring_allreduce(config, flags, left, right, digests.data(), digests.data(), digests.size(), max,
                                             detail::DirectWrite{}, relay_duties, failure));
    // The majority digest (ties: the lowest rank's); every rank computes the same.
    std::uint64_t majority = digests[0];
    int best = 0;
    for (std::size_t i = 0; i < digests.size(); ++i) {
      const int votes_for = static_cast<int>(std::count(digests.begin(), digests.end(), digests[i]));
      if (votes_for > best) best = votes_for, majority = digests[i];
    }
    if (best == size) return Status::ok();
    ++digest_mismatch_count;
    std::string all;
    for (int r = 0; r < size; ++r) all += fmt::format("{}{}:{:08x}", r ? " " : "", r, digests[static_cast<std::size_t>(r)] & 0xffffffffu);
    for (int r = 0; r < size; ++r)
      if (digests[static_cast<std::size_t>(r)] != majority) {
        log.error("collective #{}: rank {}'s result differs from the majority's (digests {})", seq, r, all);
        emit(HealthEvent{EventKind::DigestMismatch, rank, -1, -1, 0, 0, static_cast<std::uint64_t>(r), all, 0});
      }
    return Status::ok();
  }
  int event_fd = -1;            // RINGFENCE_HEALTH_LOG

  void emit(HealthEvent e) noexcept {
    e.rank = rank;
    e.sequence = seq;
    e.epoch = epoch;
    e.unix_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    try {
      if (event_callback) event_callback(e);
      if (event_fd >= 0) {
        const std::string line = to_json(e) + "\n";
        if (::write(event_fd, line.data(), line.size()) < 0) log.warn("health log write failed: {}", std::strerror(errno));
      }
    } catch (const std::exception& ex) {
      log.warn("health event callback threw: {}", ex.what());
    } catch (...) {
    }
  }
  // Internal memory (flags + inboxes) and user allocations: pointer -> allocating transport
  // (nullptr = plain heap).
  std::vector<std::pair<void*, Transport*>> allocations;
  std::vector<detail::Channel*> channel_of;     // by rank; null for ourselves
  std::vector<detail::Channel*> position_channel;  // by ring position; null for ourselves
  bool tree_allowed = false;                    // the plan lets the double binary tree run
  std::vector<std::byte> oneshot_copy;          // in-place one-shot allreduce input (one slot)
  std::uint8_t barrier_token = 0;               // barrier_async's one-byte allreduce
  int group_depth = 0;                          // group_start() nesting
  std::vector<detail::P2POp> group_ops;         // queued by send()/recv() inside a group
  std::vector<detail::P2POp> alltoall_ops;      // alltoall's transfers (run on the executing thread)
  // Lane workers: lane l >= 1 runs lane_jobs[l] when lane_round moves and l < lanes_in_use.
  std::vector<LaneJob> lane_jobs;
  std::vector<std::thread> lane_threads;
  std::mutex lane_mutex;
  std::condition_variable lane_cv, lane_done_cv;
  std::uint64_t lane_round = 0;
  int lanes_in_use = 1;
  int lanes_pending = 0;
  bool lane_stop = false;
  std::vector<std::byte> alltoall_relay;        // blocks this rank carries around fenced links

  bool is_fenced(int a, int b) const noexcept {
    const LinkId l = LinkId::of(a, b);
    return std::find(fenced.begin(), fenced.end(), l) != fenced.end();
  }

  // ---- asynchronous calls: one progress thread runs queued closures in issue order ----
  std::mutex queue_mutex;
  std::condition_variable queue_cv;      // work queued, or the queue drained
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Work::State>>> queue;
  bool worker_busy = false;
  bool worker_stop = false;
  std::thread worker;

  // Runs `run` now (blocking call: after the queue drained) or queues it (async). The checks
  // already ran on the caller's thread.
  template <class Run>
  Work issue(bool async, const char* call, Run run) {
    std::function<void()> gate = std::exchange(next_gate, {});  // a stream-ordered call's input gate
    RINGFENCE_EXPECTS(group_depth == 0, "rank {}: {}: collectives inside group_start()/group_end() are not supported", rank, call);
    if (!async) {
      drain();
      apply_timeout(call_timeout);
      run();
      return Work{};
    }
    auto state = std::make_shared<Work::State>();
    std::lock_guard lock(queue_mutex);
    if (!worker.joinable()) worker = std::thread([this] { work_loop(); });
    queue.emplace_back(std::function<void()>([this, t = call_timeout, run = std::move(run), gate = std::move(gate)] {
                         struct Scope {  // the call's path lasts as long as the call
                           bool& flag;
                           ~Scope() { flag = false; }
                         } scope{device_active};
                         if (gate) gate();  // sets device_active for a device-lane call
                         apply_timeout(t);
                         run();
                       }),
                       state);
    queue_cv.notify_all();
    return Work(std::move(state));
  }

  // Stream-ordered calls (device_staging.hpp): the stager, made at the first one, and the gate
  // the next queued call runs first.
  std::unique_ptr<detail::DeviceStager> stager;
  std::function<void()> next_gate;

  // Device regions (docs/device.md "Device regions in the engine"): stream-ordered collectives
  // run the executor on the user's device buffers over the device lane, a lane of its own whose
  // links are device transports (nvlink, pcie) and whose staging slots and scratch are device
  // memory. Decided by every rank together at the first stream-ordered collective.
  std::unique_ptr<LaneState> device_lane;
  // The same lane for other threads (abort(), links()): published once it is complete, so a
  // reader sees no lane or a whole one.
  std::atomic<LaneState*> device_lane_view{nullptr};
  int device_verdict = 0;           // 0: not decided yet, 1: device lane, -1: staged
  std::string device_why_not;       // why staged (the first rank that could not, and why)
  detail::CudaApi device_cuda;
  detail::DeviceKernels device_kernels;
  int device_ordinal = 0;           // the CUDA device current on the thread that built the lane
  detail::DeviceRegions device_regions;
  std::vector<detail::Channel*> device_channel_of;  // the device lane's channel per rank (null for ourselves)
  std::vector<detail::Channel*> device_position_channel;  // per ring position, for tree/direct/one-shot (run_device_call)
  std::byte* device_oneshot_input = nullptr;  // one slot of device memory: an in-place one-shot allreduce's input
  bool device_active = false;       // the call running on the progress thread runs on the device lane (its gate says so)
  std::vector<LinkId> moved_pairs;  // pairs agreements moved to a fallback (apply_moves; the same on every rank)

  // The device transport the device lane's link to `peer`, now over `from`, moves to when the link
  // must be fenced: the first allowed pair (CommOptions::fallbacks) from `from` to another
  // transport that writes device memory and reaches the peer; null = none.
  Transport* device_fallback(const std::string& from, int peer) const {
    for (const auto& [a, b] : options.fallbacks)
      if (a == from)
        if (Transport* t = device_transport(peer, b)) return t;
    return nullptr;
  }

  // The first transport (registry order) that writes device memory and reaches `peer`, or the
  // one named `name` if it does; null = none.
  Transport* device_transport(int peer, std::string_view name = {}) const {
    for (const auto& t : transports)
      if ((name.empty() || t->name() == name) && t->writes_device_memory() &&
          t->can_reach(self, peer_info[static_cast<std::size_t>(peer)]).ok)
        return t.get();
    return nullptr;
  }

  // This rank's reason it cannot run device regions (empty: it can); `via[p]` gets the device
  // transport to rank p (its fallback for a pair fenced or moved before the lane was built).
  std::string device_lane_refusal(std::vector<Transport*>& via) {
    if (options.device_regions == DeviceRegionsMode::Off) return "RINGFENCE_DEVICE_REGIONS=off";
    if (engine.checksum) return "checksums are on (RINGFENCE_CHECKSUM): chunks are verified on the host";
    if (store->collective_only()) return "the bootstrap store is collective-only (MPI): the device lane is built lazily";
    device_cuda = detail::load_cuda_api(options.cuda_runtime);
    if (!device_cuda.usable) return device_cuda.why_not;
    if (!device_cuda.ipc) return device_cuda.ipc_why_not;
    if (!device_cuda.set_device) return fmt::format("{} lacks cudaSetDevice", device_cuda.library);
    via.assign(static_cast<std::size_t>(size), nullptr);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      Transport*& t = via[static_cast<std::size_t>(p)];
      t = device_transport(p);
      if (!t) return fmt::format("no transport writes device memory to rank {} (register nvlink or pcie, transports/cuda_ipc/README.md)", p);
      const LinkId pair = LinkId::of(rank, p);
      if (is_fenced(rank, p) || std::find(moved_pairs.begin(), moved_pairs.end(), pair) != moved_pairs.end())
        if (Transport* fallback = device_fallback(std::string(t->name()), p)) t = fallback;
    }
    device_kernels = detail::load_device_kernels(options.cuda_kernels);  // last: only where it would be used
    if (!device_kernels.usable) return device_kernels.why_not;
    return {};
  }

  // Whether stream-ordered collective `call` runs on the device lane. The first call decides,
  // on every rank at the same call (stream-ordered collectives are issued in the same order
  // everywhere): each rank posts whether it can, and the lane is built only when all can.
  // Throws `CudaError` when RINGFENCE_DEVICE_REGIONS=on and some rank cannot.
  bool use_device_lane(const char* call) {
    if (device_verdict != 0) return device_verdict > 0;
    check_usable(call);
    std::vector<Transport*> via;
    const std::string mine = device_lane_refusal(via);
    // Every rank posts its answer (a collective-only store, the same on every rank, refuses on
    // every rank and takes none). A rank that cannot decides alone: staged, whatever the others
    // say, and they read its "no"; one that can must hear every other rank's "yes".
    if (!store->collective_only())
      store->set(fmt::format("device/{}/can", rank), to_bytes(mine.empty() ? std::string("1") : "0" + mine));
    std::string first = mine.empty() ? std::string() : fmt::format("rank {}: {}", rank, mine);  // the first refusal
    for (int r = 0; r < size && first.empty(); ++r) {
      const std::string v = to_string(store->get(fmt::format("device/{}/can", r), options.timeout));
      if (v.empty() || v[0] != '1') first = fmt::format("rank {}: {}", r, v.empty() ? std::string("?") : v.substr(1));
    }
    if (!first.empty()) {
      device_verdict = -1;
      device_why_not = first;
      if (options.device_regions == DeviceRegionsMode::On)
        throw CudaError(fmt::format("rank {}: {} on a CUDA stream: device regions are required (RINGFENCE_DEVICE_REGIONS=on) but {}",
                                    rank, call, first),
                        0);
      log.info("stream-ordered collectives are host-staged: {}", first);
      return false;
    }
    auto L = std::make_unique<LaneState>();
    L->engine = engine;
    L->engine.checksum = false;
    L->engine.trailers = false;
    std::vector<PeerInfo> peers;
    for (auto& ch : channels) {  // lane 0's order: connect_lane pairs channels[i] with peers[i]
      detail::Channel& mine_ch = L->channel_to(ch->peer);
      Transport* t = via[static_cast<std::size_t>(ch->peer)];
      mine_ch.transport = t;
      mine_ch.transport_name = std::string(t->name());
      mine_ch.expected_gbps = t->can_reach(self, peer_info[static_cast<std::size_t>(ch->peer)]).bandwidth_gbps;
      peers.push_back(peer_info[static_cast<std::size_t>(ch->peer)]);
    }
    if (const int err = device_cuda.get_device(&device_ordinal); err != detail::kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {}: {}", rank, call, device_cuda.describe("cudaGetDevice", err)), err);
    connect_lane(*L, kDeviceLane, peers, MemoryKind::Device);
    device_regions = detail::DeviceRegions{&device_cuda, &device_kernels, nullptr};
    if (const int err = device_cuda.stream_create(&device_regions.stream, detail::kCudaStreamNonBlocking); err != detail::kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {}: {}", rank, call, device_cuda.describe("cudaStreamCreateWithFlags", err)), err);
    device_channel_of.assign(static_cast<std::size_t>(size), nullptr);
    for (auto& ch : L->channels) device_channel_of[static_cast<std::size_t>(ch->peer)] = ch.get();
    device_position_channel.assign(static_cast<std::size_t>(size), nullptr);  // filled per call (run_device_call)
    device_lane = std::move(L);
    device_lane_view.store(device_lane.get(), std::memory_order_release);
    device_verdict = 1;
    log.info("stream-ordered collectives run on device regions ({} kernels)", device_kernels.library);
    return true;
  }

  // The bytes a call reads from its send buffer and writes to its receive buffer (the argument
  // checks below return them).
  struct IoBytes {
    std::size_t in = 0;
    std::size_t out = 0;
  };

  // Runs one stream-ordered call whose argument checks ran: `issue_on(in, out)` issues the
  // asynchronous host call. On the device lane (when every rank chose it, use_device_lane) it
  // gets the user's `send` and `recv`, which must be memory the GPU can address (device, managed
  // or pinned host memory: kernels and peer copies touch them), and the stream gets only the
  // gate's event and the host function that waits; else it gets staging (staged).
  template <class IssueOn>
  void stream_ordered(const char* call, CudaStream stream, const void* send, IoBytes io, void* recv, IssueOn issue_on) {
    if (!use_device_lane(call))
      return staged(call, stream, send, io.in, recv, io.out, [&](std::byte* in, std::byte* out) { return issue_on(in, out); });
    check_device_pointer(call, "sendbuff", send, io.in);
    check_device_pointer(call, "recvbuff", recv, io.out);
    staged(call, stream, {}, {}, [&](std::byte*, std::byte*) { return issue_on(send, recv); }, true);
  }

  void check_device_pointer(const char* call, const char* what, const void* p, std::size_t bytes) const {
    if (bytes == 0 || p == nullptr) return;
    detail::CudaPointerAttributes a;
    const int err = device_cuda.pointer_attributes(&a, p);
    RINGFENCE_EXPECTS(err == detail::kCudaSuccess && a.type != 0,
                      "rank {}: {} on a CUDA stream: {} {} is not device, managed or pinned host memory ({}): device regions "
                      "read and write it on the GPU (RINGFENCE_DEVICE_REGIONS=off stages any memory)",
                      rank, call, what, p, err == detail::kCudaSuccess ? "plain host memory" : device_cuda.describe("cudaPointerGetAttributes", err));
  }

  // Runs ring collective `c` of the current call on the device lane (run_ring_call's device
  // branch): the ring order of the plan, every link direct (the device lane has one to every
  // peer, so fenced lane-0 hops need no relay), the fingerprint compared first.
  // Kernels launch only into streams of the thread's current device, and this thread (the
  // progress thread) is not the one that chose it.
  // Throws CudaError ("rank R: <what>: cudaSetDevice failed: ...").
  void make_lane_device_current(const std::string& what) const {
    if (const int err = device_cuda.set_device(device_ordinal); err != detail::kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {}: {}", rank, what, device_cuda.describe("cudaSetDevice", err)), err);
  }
  // The same before a device-lane call, failing the communicator like a failed collective.
  void enter_device(const char* call) {
    try {
      make_lane_device_current(fmt::format("{} on a CUDA stream", call));
    } catch (const CudaError& e) {
      device_call_failed(e.what(), e.native());
    }
  }
  // A CUDA call of a device-lane collective failed outside the executor: the communicator fails
  // (the peers learn it at once) and the call throws CudaError(`why`).
  [[noreturn]] void device_call_failed(const std::string& why, int err) {
    record_failure(Status(ErrorCode::Cuda, err), why);
    abort_peers(ErrorCode::Cuda, rank);
    throw CudaError(why, err);
  }

  // Tree, direct and one-shot allreduce (c.by_position set) address their peers by ring
  // position: the device lane's channels in the plan's order. One-shot in place first copies the
  // input on the device (the executor sends it to every peer while results land in it).
  void run_device_call(const char* call, const detail::RingCall& c, const Reducer& reducer) {
    settle_call(call);
    enter_device(call);
    LaneState& L = *device_lane;
    L.engine.position = engine.position;
    detail::Channel* left = nullptr;
    detail::Channel* right = nullptr;
    const auto n = static_cast<std::size_t>(size);
    if (size > 1) {
      const auto at = static_cast<std::size_t>(engine.position);
      left = &L.channel_to(ring[(at + n - 1) % n]);
      right = &L.channel_to(ring[(at + 1) % n]);
    }
    detail::RingCall d = c;
    d.device = &device_regions;
    d.check = nullptr;
    if (c.by_position) {
      for (std::size_t p = 0; p < ring.size(); ++p)  // sized when the lane was built (ring: empty on one rank)
        device_position_channel[p] = ring[p] != rank ? &L.channel_to(ring[p]) : nullptr;
      d.by_position = device_position_channel.data();
      d.by_rank = device_channel_of.data();
    }
    if (c.kind == detail::RingCollective::OneShotAllreduce && c.send == c.recv && c.count > 0) {
      const std::size_t bytes = c.count * reducer.elem_size;  // at most one slot (allreduce checked)
      int err = device_cuda.memcpy_async(device_oneshot_input, c.send, bytes, detail::kCudaMemcpyDefault, device_regions.stream);
      if (err == detail::kCudaSuccess) err = device_cuda.stream_synchronize(device_regions.stream);
      if (err != detail::kCudaSuccess)
        device_call_failed(fmt::format("rank {}: {} on a CUDA stream: copying the one-shot input: {}", rank, call,
                                       device_cuda.describe("cudaMemcpyAsync", err)),
                           err);
      d.send = device_oneshot_input;
    }
    detail::Failure failure;
    const Status s = detail::run_ring(L.engine, L.flags, left, right, d, reducer, detail::DirectWrite{}, L.relay_duties, failure);
    judge_call(call);
    if (!s.is_ok()) raise(call, failure);
  }

  // Runs one stream-ordered call: `queue(in, out)` issues the asynchronous host collective
  // from staging `in` to staging `out`. Argument checks already ran.
  template <class Queue>
  void staged(const char* call, CudaStream stream, const void* src, std::size_t in_bytes, void* dst, std::size_t out_bytes,
              Queue queue) {
    const detail::DeviceStager::Piece in{const_cast<void*>(src), in_bytes}, out{dst, out_bytes};
    staged(call, stream, std::span(&in, in_bytes > 0 ? 1 : 0), std::span(&out, out_bytes > 0 ? 1 : 0), queue);
  }
  // The same with several user buffers per direction (a group of sends and receives): inputs
  // are packed one after another into staging `in`, outputs unpacked from staging `out`.
  // `device`: the call runs on the device lane (stream_ordered), staging nothing.
  template <class Queue>
  void staged(const char* call, CudaStream stream, std::span<const detail::DeviceStager::Piece> inputs,
              std::span<const detail::DeviceStager::Piece> outputs, Queue queue, bool device = false) {
    check_usable(call);
    if (!stager) stager = std::make_unique<detail::DeviceStager>(rank, call, options.cuda_runtime, options.device_staging_slots);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(call_timeout.count() > 0 ? call_timeout : options.timeout);
    stager->run(call, stream.handle, inputs, outputs, wait,
                [&](std::byte* in, std::byte* out, detail::DeviceStager::Gate gate) {
                  // Waits for the input copy in short slices, so abort() and failures end it
                  // at once. A gate that times out breaks the communicator like a failed
                  // collective: this rank skipped a call its peers are in.
                  next_gate = [this, gate = std::move(gate), wait, call, device] {
                    const auto deadline = std::chrono::steady_clock::now() + wait;
                    auto ready = [&] {
                      try {
                        return gate(std::chrono::milliseconds(20));
                      } catch (const CudaError& e) {
                        const std::string msg = fmt::format("rank {}: {} on a CUDA stream: {}", rank, call, e.what());
                        record_failure(Status(ErrorCode::Cuda, e.native()), msg);
                        abort_peers(ErrorCode::Cuda, rank);
                        throw CudaError(msg, e.native());
                      }
                    };
                    while (!ready()) {
                      check_usable(call);
                      if (std::chrono::steady_clock::now() < deadline) continue;
                      const std::string msg = fmt::format(
                          "rank {}: {} on a CUDA stream: {} did not finish within {} ms (is the stream blocked by earlier work?)",
                          rank, call, device ? "the stream's work before the call" : "the copy of the input to host staging",
                          wait.count());
                      record_failure(Status(ErrorCode::Timeout), msg);
                      abort_peers(ErrorCode::Timeout, rank);
                      throw TimeoutError(msg);
                    }
                    device_active = device;  // the stream got here: the call runs on its path
                  };
                  try {
                    Work w = queue(in, out);
                    next_gate = {};
                    return w;
                  } catch (...) {
                    next_gate = {};
                    throw;
                  }
                });
  }

  // The deadline of the call about to run on every lane: set_timeout()'s value or the default.
  void apply_timeout(std::chrono::milliseconds t) noexcept {
    const std::chrono::nanoseconds effective = t.count() > 0 ? t : options.timeout;
    for_each_lane_and_device([&](LaneState& L) { L.engine.timeout = effective; });
  }

  void work_loop() {
    std::unique_lock lock(queue_mutex);
    for (;;) {
      queue_cv.wait(lock, [&] { return worker_stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and nothing left
      auto [run, state] = std::move(queue.front());
      queue.pop_front();
      worker_busy = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        run();
      } catch (...) {
        error = std::current_exception();
      }
      state->finish(error);
      lock.lock();
      worker_busy = false;
      queue_cv.notify_all();
    }
  }

  // Waits until every queued call finished (a no-op without asynchronous calls). Bounded: each
  // queued collective is bounded by the timeout, and after a failure the rest fail at once.
  void drain() {
    if (!worker.joinable()) return;  // no asynchronous call was ever made (only this thread starts it)
    std::unique_lock lock(queue_mutex);
    queue_cv.wait(lock, [&] { return queue.empty() && !worker_busy; });
  }

  // The collectives: argument checks here, on the caller's thread; the closure runs now or on
  // the progress thread (defined after the class).
  // Each collective's argument checks, on the caller's thread, shared by the host calls and the
  // stream-ordered ones (which check the user's device buffers, then run the host call on
  // staging): the bytes this rank reads from `send` and writes to `recv`. Throw InvalidUsage.
  IoBytes check_allreduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type,
                          ReduceOp op) const {
    check_type(call, type);
    check_op(call, op);
    const std::size_t bytes = bytes_of(call, "count", count, type);
    check_pointer(call, "sendbuff", send, bytes);
    check_pointer(call, "recvbuff", recv, bytes);
    check_overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
    return {bytes, bytes};
  }
  IoBytes check_reduce_scatter(const char* call, const void* send, const void* recv, std::size_t recvcount, DataType type,
                               ReduceOp op) const {
    check_type(call, type);
    check_op(call, op);
    return check_blocks(call, "recvcount", recvcount, type, send, recv, true);
  }
  IoBytes check_allgather(const char* call, const void* send, const void* recv, std::size_t sendcount, DataType type) const {
    check_type(call, type);
    return check_blocks(call, "sendcount", sendcount, type, send, recv, false);
  }
  // The block collectives: one buffer holds a block per rank (reduce_scatter's send,
  // allgather's recv), the other one block. Checks both pointers and allows an overlap only in
  // NCCL's in-place form, the single block being block `rank` of the whole buffer.
  IoBytes check_blocks(const char* call, const char* count_name, std::size_t count, DataType type, const void* send,
                       const void* recv, bool send_is_whole) const {
    const std::size_t block = bytes_of(call, count_name, count, type);
    const std::size_t whole = bytes_of(call, count_name, count, type, static_cast<std::size_t>(size));
    const IoBytes io = send_is_whole ? IoBytes{whole, block} : IoBytes{block, whole};
    check_pointer(call, "sendbuff", send, io.in);
    check_pointer(call, "recvbuff", recv, io.out);
    const void* whole_at = send_is_whole ? send : recv;
    const void* block_at = send_is_whole ? recv : send;
    const void* slot = whole_at ? static_cast<const std::byte*>(whole_at) + static_cast<std::size_t>(rank) * block : nullptr;
    check_overlap(call, send, io.in, recv, io.out, block_at == slot,
                  send_is_whole ? "recvbuff == sendbuff + rank * recvcount elements" : "sendbuff == recvbuff + rank * sendcount elements",
                  slot);
    return io;
  }
  // `send` is read on the root only.
  IoBytes check_broadcast(const char* call, const void* send, const void* recv, std::size_t count, DataType type, int root) const {
    check_type(call, type);
    check_root(call, root);
    const std::size_t bytes = bytes_of(call, "count", count, type);
    if (rank == root) check_pointer(call, "sendbuff (on the root)", send, bytes);
    check_pointer(call, "recvbuff", recv, bytes);
    if (rank == root) check_overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
    return {rank == root ? bytes : 0, bytes};
  }
  // `recv` is written on the root only.
  IoBytes check_reduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                       int root) const {
    check_type(call, type);
    check_op(call, op);
    check_root(call, root);
    const std::size_t bytes = bytes_of(call, "count", count, type);
    check_pointer(call, "sendbuff", send, bytes);
    if (rank == root) {
      check_pointer(call, "recvbuff (on the root)", recv, bytes);
      check_overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
    }
    return {bytes, rank == root ? bytes : 0};
  }
  IoBytes check_alltoall(const char* call, const void* send, const void* recv, std::size_t count, DataType type) const {
    check_type(call, type);
    const std::size_t bytes = bytes_of(call, "count", count, type, static_cast<std::size_t>(size));
    check_pointer(call, "sendbuff", send, bytes);
    check_pointer(call, "recvbuff", recv, bytes);
    check_overlap(call, send, bytes, recv, bytes, false, nullptr, nullptr);
    return {bytes, bytes};
  }

  Work allreduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 detail::CallKind kind = detail::CallKind::Allreduce);
  // The fingerprint of a call (check_call fills in the number and the CRC).
  static detail::CallFingerprint fingerprint(detail::CallKind kind, std::uint64_t count, DataType type, int op = -1, int root = -1) {
    detail::CallFingerprint f;
    f.collective = static_cast<std::uint8_t>(kind);
    f.count = count;
    f.type = static_cast<std::uint8_t>(type);
    f.op = op < 0 ? std::uint8_t{0} : static_cast<std::uint8_t>(op);
    f.root = root;
    return f;
  }
  void run_ring_allreduce_call(const char* call, const void* send, void* recv, std::size_t count, std::size_t bytes,
                               const Reducer& reducer);
  // Direct writes of final values into the right neighbour's output (ring allreduce, allgather
  // and broadcast) for call `c` on `lane`: enabled from `direct_write_min_bytes` without checksums.
  detail::DirectWrite direct_write_for(LaneState& lane, const detail::RingCall& c, std::size_t elem_size);
  Work reduce_scatter(bool async, const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op);
  Work allgather(bool async, const void* send, void* recv, std::size_t sendcount, DataType type);
  Work broadcast(bool async, const void* send, void* recv, std::size_t count, DataType type, int root);
  Work reduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root);
  Work alltoall(bool async, const void* send, void* recv, std::size_t count, DataType type);

  void stop_worker() noexcept {
    {
      std::lock_guard lock(queue_mutex);
      worker_stop = true;
      queue_cv.notify_all();
    }
    if (worker.joinable()) worker.join();
  }
  std::uint64_t seq = 0;
  // Direct-write caches: our output buffers registered with the left link's transport, and the
  // right neighbour's output keys imported. Bounded; misses allocate (like NCCL's lazy
  // registration), hits do not.
  struct LocalReg {
    const void* ptr;
    std::size_t bytes;
    MemoryRegion region;
    Bytes key;
  };
  struct RemoteReg {
    Bytes key;
    RemoteRegion region;
  };
  static constexpr std::size_t kRegCacheEntries = 32;
  std::deque<LocalReg> local_regs;   // deques: entries keep their address while others come and go
  std::vector<std::pair<std::uintptr_t, std::size_t>> user_allocs;  // alloc()ed ranges
  std::deque<RemoteReg> remote_regs;
  std::mutex regs_mutex;  // guards remote_regs (lane workers import concurrently)
  mutable std::mutex status_mutex;  // guards `failure` for async_error() from other threads
  // Guards each channel's `link` and `transport_name` where a move replaces them (reconnect),
  // against links() from other threads; the communicator's own thread reads them without it
  // (only that thread writes them).
  mutable std::mutex links_mutex;
  Status failure;
  std::atomic<bool> failed{false};  // failure is set (lock-free fast path of check_usable)
  std::string failure_message;      // why (complete sentence naming the ranks), without the call
  std::chrono::milliseconds call_timeout{0};  // set_timeout(): deadline of the calls issued next (0 = options.timeout)

  // Records the first failure (later ones are consequences). False when one was recorded.
  bool record_failure(Status s, const std::string& why) noexcept {
    std::lock_guard lock(status_mutex);
    if (!failure.is_ok()) return false;
    try {
      failure_message = why;
    } catch (...) {
    }
    failure = s;
    failed.store(true, std::memory_order_release);
    return true;
  }

  // Ends in-flight work of this rank: every lane's abort word names us as the reporter (a local
  // abort; see raise()) and `blamed` as the cause. Waits see it within one sleep slice (50 ms).
  // Any thread; never blocks.
  void local_abort(ErrorCode code, int blamed) noexcept {
    const std::uint32_t value = detail::FlagBlock::abort_value(code, rank, blamed);
    for_each_lane_and_device([&](LaneState& L) {
      if (!L.flags.abort) return;
      std::uint32_t expected = 0;
      L.flags.abort->value.compare_exchange_strong(expected, value, std::memory_order_acq_rel);
    });
  }

  // ---- call fingerprints (options.check_calls) ----
  detail::Channel* fp_from = nullptr;     // lane-0 channel whose fingerprint we check
  std::vector<detail::Channel*> fp_to;    // lane-0 channels of the ranks that check ours

  static std::string describe(const detail::CallFingerprint& f) {
    using K = detail::CallKind;
    const auto kind = static_cast<K>(f.collective);
    const char* name = kind == K::Allreduce       ? "allreduce"
                       : kind == K::ReduceScatter ? "reduce_scatter"
                       : kind == K::Allgather     ? "allgather"
                       : kind == K::Broadcast     ? "broadcast"
                       : kind == K::Reduce        ? "reduce"
                       : kind == K::Alltoall      ? "alltoall"
                       : kind == K::Barrier       ? "barrier"
                                                  : "an unknown collective";
    if (kind == K::Barrier) return "barrier()";
    std::string out = fmt::format("{}(count={}, {}", name, f.count, to_string(static_cast<DataType>(f.type)));
    if (kind == K::Allreduce || kind == K::ReduceScatter || kind == K::Reduce) out += fmt::format(", {}", to_string(static_cast<ReduceOp>(f.op)));
    if (f.root >= 0) out += fmt::format(", root={}", f.root);
    return out + ")";
  }

  // This collective's check: posted by begin_collective, compared by the ring executor (the
  // first data leaves without waiting for it) or by settle_call before the call moves data.
  detail::CallCheck call_check;

  // Posts our fingerprint of the collective starting now to the ranks that check it; the
  // comparison with the one we check comes later (settle_call, or the executor: RingCall::check).
  void post_call(const char* call, detail::CallFingerprint mine) {
    if (!fp_from) return;
    mine.sequence = seq;
    mine.crc = crc32c(&mine, offsetof(detail::CallFingerprint, crc));
    detail::Failure failure;
    if (!detail::post_fingerprint(engine, flags, left, right, relay_duties, fp_to.data(), fp_to.size(), mine, failure).is_ok())
      raise(call, failure);
    call_check.from = fp_from;
    call_check.mine = mine;
  }

  // Compares the fingerprints now, before the call moves data: for calls that cannot leave it
  // to the executor (see can_defer_check).
  void settle_call(const char* call) {
    if (!call_check.from || call_check.settled) return;
    detail::Failure failure;
    if (!detail::settle_fingerprint(engine, flags, left, right, relay_duties, call_check, failure).is_ok()) raise(call, failure);
    judge_call(call);
  }

  // Whether the executor may compare this call's fingerprints: every chunk it receives must
  // come from the rank we check, so none is used before that rank's call is known to be ours.
  // True for ring and chain schedules on one lane without relays; trees, one-shot and direct
  // allreduce receive from every rank (unless there are only two), and extra lanes from links
  // other than the checked one.
  bool can_defer_check(const detail::RingCall& c, int lanes) const noexcept {
    return call_check.from && call_check.from == left && relay_duties.count == 0 && lanes <= 1 && (!c.by_position || size == 2);
  }

  // After the data phase (or when it failed): a disagreement fails the call on this rank and
  // aborts the others (InvalidUsage naming both ranks and both calls); a damaged or stale
  // fingerprint is evidence against the link, not a disagreement. A failed data phase may
  // have been cut short by the peer that found the disagreement first: its fingerprint
  // explains the failure better than its abort does.
  void judge_call(const char* call) {
    detail::CallCheck& k = call_check;
    if (!k.from) return;
    if (!k.settled) detail::read_fingerprint(flags, k);
    if (!k.settled) return;
    detail::Channel& from = *k.from;
    k.from = nullptr;  // judged once
    if (!k.intact) {
      ++from.checksum_errors;
      log.warn("collective #{}: the call fingerprint from rank {} arrived damaged or not at all ({} link); not compared", seq,
               from.peer, from.transport_name);
      return;
    }
    if (!k.disagree()) return;
    const int peer = from.peer;
    abort_peers(ErrorCode::InvalidUsage, peer);
    const std::string why = fmt::format(
        "the ranks disagree on collective #{}: rank {} called {}, rank {} called {} (every rank must make the same collective "
        "calls in the same order, with the same count, datatype, op and root)",
        seq, rank, describe(k.mine), peer, describe(k.theirs));
    record_failure(Status(ErrorCode::InvalidUsage), why);
    const std::string message = fmt::format("rank {}: {} #{} refused: {}", rank, call, seq, why);
    log.error("{}", message);
    throw InvalidUsage(message);
  }

  // ---- liveness heartbeat (options.heartbeat_interval) ----
  // Its own lane: one link per peer that only its thread drives (the SPI's one-thread rule).
  // On the beat lane, data[p] counts p's beats, credit[p] = 1 says p closed its communicator,
  // and the abort word carries an abort() of a peer.
  std::unique_ptr<LaneState> beat_lane;
  std::thread beat_thread;
  std::mutex beat_mutex;
  std::condition_variable beat_cv;
  bool beat_stop = false;
  bool abort_requested = false;  // abort(): tell the peers
  // Per rank: steady-clock time (ns) its heartbeat last advanced, 0 = not yet; and whether it
  // closed its communicator. Read by raise() and begin_collective() on other threads.
  std::unique_ptr<std::atomic<std::int64_t>[]> beat_seen_ns;
  std::unique_ptr<std::atomic<bool>[]> peer_left;
  std::atomic<int> peers_left{0};

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  void start_heartbeat() {
    beat_seen_ns = std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(size));
    peer_left = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(size));
    const std::int64_t start = now_ns();
    for (int r = 0; r < size; ++r) beat_seen_ns[static_cast<std::size_t>(r)].store(start), peer_left[static_cast<std::size_t>(r)].store(false);
    beat_thread = std::thread([this] { beat_loop(); });
  }

  void stop_heartbeat() noexcept {
    if (!beat_thread.joinable()) return;
    {
      std::lock_guard lock(beat_mutex);
      beat_stop = true;
    }
    beat_cv.notify_all();
    beat_thread.join();
  }

  // A peer failed as the heartbeat sees it: record it (first failure only) and end in-flight work.
  void peer_lost(int peer, ErrorCode code, const std::string& why) noexcept {
    if (!record_failure(Status(code), why)) return;
    log.error("{}", why);
    local_abort(code, peer);
  }

  void beat_loop() noexcept {
    try {
      const auto period = options.effective_heartbeat();
      const auto limit = options.timeout;
      std::vector<std::uint32_t> seen(static_cast<std::size_t>(size), 0);
      std::vector<std::chrono::steady_clock::time_point> changed(static_cast<std::size_t>(size), std::chrono::steady_clock::now());
      std::vector<char> watched(static_cast<std::size_t>(size), 1);
      std::uint32_t beat = 0;
      bool abort_sent = false, abort_seen = false;
      auto left_cleanly = [&](const detail::Channel& ch) {
        const auto p = static_cast<std::size_t>(ch.peer);
        watched[p] = 0;
        peer_left[p].store(true, std::memory_order_release);
        peers_left.fetch_add(1, std::memory_order_acq_rel);
        log.info("rank {} closed its communicator", ch.peer);
      };
      auto last_sweep = std::chrono::steady_clock::now();
      std::unique_lock lock(beat_mutex);
      for (;;) {
        const bool stop = beat_stop;
        // This thread itself may not have run for a while (an overloaded host): silence is
        // only judged over time it was awake to see beats arrive.
        if (const auto now = std::chrono::steady_clock::now(); now - last_sweep > limit / 2)
          std::fill(changed.begin(), changed.end(), now);
        last_sweep = std::chrono::steady_clock::now();
        const bool send_abort = abort_requested && !abort_sent;
        lock.unlock();
        ++beat;
        for (auto& chp : beat_lane->channels) {
          detail::Channel& ch = *chp;
          const auto p = static_cast<std::size_t>(ch.peer);
          const std::size_t word = stop ? detail::FlagBlock::credit_offset(size, rank) : detail::FlagBlock::data_offset(size, rank);
          Status s = Status::ok();
          if (send_abort)  // before a goodbye: the peer must learn that we aborted, not that we left
            s = ch.link->signal(
                SignalOp{&ch.peer_flags, detail::FlagBlock::abort_offset(size), detail::FlagBlock::abort_value(ErrorCode::Aborted, rank, -1), 0});
          if (s.is_ok()) s = ch.link->signal(SignalOp{&ch.peer_flags, word, stop ? 1u : beat, 0});
          for (;;) {  // completions carry nothing we need; keep the queue empty
            Completion done[8];
            std::size_t n = 0;
            if (!ch.link->poll(done, n).is_ok() || n < std::size(done)) break;
          }
          if (stop || !watched[p]) continue;
          const detail::FlagBlock& in = beat_lane->flags;
          if (!abort_seen)
            if (const std::uint32_t a = in.abort->value.load(std::memory_order_acquire); a != 0) {
              abort_seen = true;
              const int reporter = static_cast<int>((a >> 12) & 0xfffu) - 1;
              peer_lost(reporter, ErrorCode::PeerUnreachable, fmt::format("rank {} aborted the communicator (abort())", reporter));
            }
          if (in.credit[p].value.load(std::memory_order_acquire) != 0) {
            // A clean goodbye: not a failure (point-to-point between the others goes on), but
            // collectives need every rank (begin_collective refuses them from now on).
            left_cleanly(ch);
            continue;
          }
          const auto now = std::chrono::steady_clock::now();
          const std::uint32_t v = in.data[p].value.load(std::memory_order_acquire);
          if (v != seen[p]) {
            seen[p] = v;
            changed[p] = now;
            beat_seen_ns[p].store(now_ns(), std::memory_order_relaxed);
          }
          // Ask the transport whether the peer is still there (shm: its pidfd) only when its
          // beats are late: the check spins first, which costs a busy host dearly.
          if (s.is_ok() && now - changed[p] > 2 * period) s = ch.link->wait(in.data[p], v + 1, std::chrono::nanoseconds(0));
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
            peer_lost(ch.peer, ErrorCode::PeerUnreachable,
                      fmt::format("rank {} is unreachable: its heartbeat link ({}) reports it gone (process exited or killed?)",
                                  ch.peer, ch.transport_name));
          } else if (now - changed[p] > limit) {
            watched[p] = 0;
            peer_lost(ch.peer, ErrorCode::Timeout,
                      fmt::format("rank {} sent no heartbeat for {} ms over {} (process stopped, hung or cut off?)", ch.peer,
                                  std::chrono::duration_cast<std::chrono::milliseconds>(now - changed[p]).count(), ch.transport_name));
          }
        }
        if (send_abort) abort_sent = true;
        lock.lock();
        if (stop) return;
        beat_cv.wait_for(lock, period, [&] { return beat_stop || (abort_requested && !abort_sent); });
      }
    } catch (const std::exception& e) {  // formatting only; the loop itself does not throw
      log.error("heartbeat thread stopped: {}", e.what());
    }
  }

  // The peer whose heartbeat is the most overdue, if one is silent for more than three periods
  // and a quarter of the timeout: the likely end of a chain of ranks waiting on each other.
  std::string silent_peer_note() const {
    std::int64_t age_ms = 0;
    const int worst = silent_peer(age_ms);
    return worst < 0 ? std::string() : fmt::format("; rank {} has sent no heartbeat for {} ms", worst, age_ms);
  }
  int silent_peer(std::int64_t& age_ms) const noexcept {
    if (!beat_seen_ns) return -1;
    const std::int64_t now = now_ns();
    const auto period_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.effective_heartbeat()).count();
    const auto quarter_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.timeout).count() / 4;
    int worst = -1;
    std::int64_t worst_age = std::max<std::int64_t>(3 * period_ns, quarter_ns);
    for (int r = 0; r < size; ++r) {
      if (r == rank || peer_left[static_cast<std::size_t>(r)].load()) continue;
      const std::int64_t age = now - beat_seen_ns[static_cast<std::size_t>(r)].load(std::memory_order_relaxed);
      if (age > worst_age) worst = r, worst_age = age;
    }
    age_ms = worst_age / 1000000;
    return worst;
  }

  ~Impl() {
    stop_worker();  // queued work finishes first (bounded; fails fast after an error)
    stop_heartbeat();  // says goodbye to every peer
    if (monitor) monitor->stop();
    if (event_fd >= 0) ::close(event_fd);
    stop_lane_workers();
    // After a failure a peer may be dead or stopped: transports must not wait for its goodbye.
    const FenceReason why = failed.load(std::memory_order_acquire) ? FenceReason::Error : FenceReason::Shutdown;
    for_each_lane_and_device([why](LaneState& L) {
      for (auto& ch : L.channels)
        if (ch->link) ch->link->fence(why);
    });
    remote_regs.clear();
    local_regs.clear();
    for_each_lane_and_device([](LaneState& L) { L.channels.clear(); });  // links, then regions, before the memory they describe
    if (device_regions.stream) device_cuda.stream_destroy(device_regions.stream);
    if (beat_lane) {
      for (auto& ch : beat_lane->channels)
        if (ch->link) ch->link->fence(why);
      beat_lane->channels.clear();
    }
    for (auto it = allocations.rbegin(); it != allocations.rend(); ++it) release(it->first, it->second);
  }

  static void release(void* ptr, Transport* t) noexcept {
    if (t)
      t->deallocate(ptr);
    else
      std::free(ptr);
  }

  void* allocate(std::size_t bytes) {
    for (auto& t : transports)
      if (void* p = t->allocate(bytes, MemoryKind::Host)) {
        allocations.emplace_back(p, t.get());
        return p;
      }
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) throw SystemError(fmt::format("rank {}: out of memory allocating {} bytes", rank, bytes), ENOMEM);
    std::memset(p, 0, bytes);
    allocations.emplace_back(p, nullptr);
    return p;
  }

  void store_barrier(const std::string& name) {
    const std::string key = fmt::format("barrier/{}", name);
    if (store->add(key, 1) == size) store->set(key + "/done", to_bytes("1"));
    (void)store->get(key + "/done", options.timeout);
  }

  // Every lane: this one (lane 0), then the extra ones.
  template <class F>
  void for_each_lane(F&& f) {
    f(static_cast<LaneState&>(*this));
    for (auto& l : extra_lanes) f(*l);
  }
  // The same plus the device lane, when built (aborts, timeouts, shutdown; fence agreements and
  // moves concern the other lanes only).
  template <class F>
  void for_each_lane_and_device(F&& f) {
    for_each_lane(f);
    if (LaneState* d = device_lane_view.load(std::memory_order_acquire)) f(*d);
  }

  // Lanes to build: RINGFENCE_CHANNELS, or (0 = auto) one per core this rank can count on —
  // online cores over the ranks on this host — at most kMaxAutoLanes. Every rank computes the
  // same number only if hosts look alike, so the result is checked in the fingerprint.
  int lane_count(const std::vector<PeerInfo>& peers) const {
    if (options.channels > 0) return options.channels;
    int local = 1;
    for (const auto& p : peers) local += p.host_id == self.host_id;
    const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    // Every link a network link: at least two lanes unless the host is oversubscribed. A tcp
    // lane's thread blocks in sends and socket reads, and a second lane overlaps them; 2 tcp
    // ranks on the 2-core VM gain 1.16-1.20x median busbw from 16 MiB (docs/tuning.md "Channels").
    const int least = network_only() && local <= cpus ? kNetworkMinLanes : 1;
    return std::clamp(std::max(static_cast<int>(cpus) / local, least), 1, kMaxAutoLanes);
  }
  static constexpr int kMaxAutoLanes = 4;
  static constexpr int kNetworkMinLanes = 2;

  static constexpr int kBeatLane = -1;    // connect_lane index of the heartbeat lane
  static constexpr int kDeviceLane = -2;  // connect_lane index of the device lane
  // Polls `pending` until `ch.link` is up. `what` ("rank 0: connecting to rank 1 over tcp")
  // starts the error: "... failed" (the transport's error class) or "... timed out after N ms".
  void finish_connect(PendingLink& pending, detail::Channel& ch, std::chrono::steady_clock::time_point deadline,
                      const std::string& what) {
    for (std::unique_ptr<Link> link;;) {
      const Status s = pending.try_finish(link);
      if (s.is_ok()) {
        std::lock_guard lock(links_mutex);  // a move's new link: links() may be reading
        ch.link = std::move(link);
        return;
      }
      if (s.is_error()) throw_status(s, what + " failed");
      if (std::chrono::steady_clock::now() >= deadline)
        throw TimeoutError(fmt::format("{} timed out after {} ms", what, options.timeout.count()));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // Connects lane `index` of `L` (its channels name peer and transport): allocates its flags,
  // staging slots and scratch, listens, connects to every peer (non-blocking, polled against
  // the deadline), registers the flags and the inbox each peer writes into and imports theirs.
  // Store keys of lane 0 have no suffix, lane c's end in "/lane<c>". `memory` Device (the device
  // lane): staging slots and scratch in device memory from the channels' transports (one
  // allocation per channel, registered whole), flags in host memory as always.
  void connect_lane(LaneState& L, int index, const std::vector<PeerInfo>& peers, MemoryKind memory = MemoryKind::Host) {
    const std::string suffix = index == 0           ? std::string()
                               : index == kBeatLane   ? std::string("/beat")
                               : index == kDeviceLane ? std::string("/device")
                                                      : fmt::format("/lane{}", index);
    L.flags_mem = allocate(detail::FlagBlock::bytes(size));
    L.flags.bind(L.flags_mem, size);
    const std::size_t inbox_bytes = L.engine.slot_stride() * static_cast<std::size_t>(L.engine.slots);
    const std::size_t scratch_bytes = L.engine.slot_bytes * static_cast<std::size_t>(L.engine.slots + 1);
    if (memory == MemoryKind::Host) {
      L.inbox_mem = allocate(inbox_bytes * L.channels.size());
      for (std::size_t i = 0; i < L.channels.size(); ++i)
        L.channels[i]->inbox = static_cast<std::byte*>(L.inbox_mem) + i * inbox_bytes;
      L.scratch_mem = allocate(scratch_bytes);
    } else {
      auto device_alloc = [&](Transport& t, std::size_t bytes) {
        void* p = t.allocate(bytes, MemoryKind::Device);
        if (!p) throw CudaError(fmt::format("rank {}: {} allocates no device memory", rank, t.name()), 0);
        allocations.emplace_back(p, &t);
        return static_cast<std::byte*>(p);
      };
      for (auto& ch : L.channels) ch->inbox = device_alloc(*ch->transport, inbox_bytes);
      // One slot more than the scratch: the input copy of an in-place one-shot allreduce.
      if (!L.channels.empty()) L.scratch_mem = device_alloc(*L.channels.front()->transport, scratch_bytes + L.engine.slot_bytes);
      device_oneshot_input = L.scratch_mem ? static_cast<std::byte*>(L.scratch_mem) + scratch_bytes : nullptr;
    }
    L.engine.scratch = static_cast<std::byte*>(L.scratch_mem);

    auto index_of = [&](const Transport* t) {
      return static_cast<std::size_t>(std::find_if(transports.begin(), transports.end(), [&](auto& x) { return x.get() == t; }) -
                                      transports.begin());
    };
    std::vector<std::unique_ptr<ListenHandle>> listeners(transports.size());
    for (auto& ch : L.channels)
      if (auto& l = listeners[index_of(ch->transport)]; !l) l = ch->transport->listen();
    for (std::size_t t = 0; t < transports.size(); ++t)
      if (listeners[t]) store->set(fmt::format("addr/{}/{}{}", rank, transports[t]->name(), suffix), listeners[t]->address());

    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    for (std::size_t i = 0; i < L.channels.size(); ++i) {
      auto& ch = *L.channels[i];
      const Bytes address = store->get(fmt::format("addr/{}/{}{}", ch.peer, ch.transport_name, suffix), options.timeout);
      finish_connect(*ch.transport->connect(*listeners[index_of(ch.transport)], peers[i], address), ch, deadline,
                     fmt::format("rank {}: connecting to rank {} over {}", rank, ch.peer, ch.transport_name));
    }

    for (auto& ch : L.channels) {
      ch->flags_region = ch->transport->register_memory(L.flags_mem, detail::FlagBlock::bytes(size), MemoryKind::Host);
      ch->inbox_region = ch->transport->register_memory(ch->inbox, inbox_bytes, memory);
      store->set(fmt::format("regions/{}/for/{}{}", rank, ch->peer, suffix),
                 pack({ch->inbox_region.key(), ch->flags_region.key(), to_bytes(protocol_fingerprint())}));
    }
    for (auto& ch : L.channels) {
      const auto parts = unpack(store->get(fmt::format("regions/{}/for/{}{}", ch->peer, rank, suffix), options.timeout), "region keys");
      RINGFENCE_EXPECTS(parts.size() == 3, "rank {}: malformed region keys from rank {}", rank, ch->peer);
      RINGFENCE_EXPECTS(to_string(parts[2]) == protocol_fingerprint(),
                        "rank {}: rank {} runs with different data-path options ('{}' vs '{}'): RINGFENCE_CHUNK_BYTES, "
                        "RINGFENCE_SLOTS, RINGFENCE_CHANNELS, RINGFENCE_DIRECT_WRITE_MIN_BYTES, RINGFENCE_CHECKSUM, RINGFENCE_ALGO and "
                        "RINGFENCE_TUNER_* must match on every rank",
                        rank, ch->peer, to_string(parts[2]), protocol_fingerprint());
      ch->peer_inbox = ch->transport->import_region(parts[0]);
      ch->peer_flags = ch->transport->import_region(parts[1]);
    }
  }

  // The transport `ch`'s link may move to when it must be fenced (CommOptions::fallbacks): the
  // first allowed pair from its transport to another selected one that reaches the peer; -1 =
  // none. Both ends evaluate it; the pair moves only when both name the same transport.
  int fallback_for(const detail::Channel& ch) const {
    if (store->collective_only()) return -1;  // a move needs the two ends to use the store alone
    for (const auto& [from, to] : options.fallbacks) {
      if (from != ch.transport_name) continue;
      for (std::size_t t = 0; t < transports.size(); ++t)
        if (transports[t]->name() == to && transports[t].get() != ch.transport &&
            transports[t]->can_reach(self, peer_info[static_cast<std::size_t>(ch.peer)]).ok)
          return static_cast<int>(t);
    }
    return -1;
  }

  // Moves our links to `peer` (every lane; the heartbeat's stays) to transport `to`, at a fence
  // agreement (docs/health.md "Moving a link"). The two ends meet in the store once both
  // finished the agreement, driving the old links while they wait. The agreement's allreduce
  // ends on each rank only once every chunk it sent was credited and every chunk it needed
  // arrived, so when both ends are there nothing either needs is in flight between them (a
  // call-fingerprint acknowledgement may be, and a later one supersedes it: they count up). Each
  // end then closes its old links, connects new ones as at setup (store keys unique to this
  // collective) and registers the same flags and staging memory: the signal words keep their
  // values, the channels their message counters. Throws on a timeout or a refused connection;
  // the caller fails the communicator.
  void move_link(int peer, Transport& to) {
    const LinkId l = LinkId::of(rank, peer);
    const std::string base = fmt::format("move/{}/{}-{}", seq, l.a, l.b);
    meet_for_move(base, peer, to, "the link", [&] { for_each_lane([&](LaneState& L) { poll_link(L.channel_to(peer)); }); });
    {
      std::lock_guard lock(regs_mutex);  // cached keys were made for the old transport
      remote_regs.clear();
    }
    local_regs.clear();
    int index = 0;
    for_each_lane([&](LaneState& L) {
      detail::Channel& ch = L.channel_to(peer);
      reconnect(L, ch, to, fmt::format("{}/lane{}", base, index++), MemoryKind::Host, "the link");
    });
    fallback_of[static_cast<std::size_t>(peer)] = fallback_for(channel_to(peer));
  }

  static void poll_link(detail::Channel& ch) noexcept {
    Completion done[8];
    std::size_t n = 0;
    if (ch.link) (void)ch.link->poll(done, n);
  }

  // The two ends of a move meet in the store under `base`; meanwhile `drive()` keeps polling the
  // old links: a signal a transport delivers only through the sender's progress (nvlink behind
  // copies) may be what the peer still waits for. `what` names the link in the timeout error.
  template <class Drive>
  void meet_for_move(const std::string& base, int peer, Transport& to, const char* what, Drive drive) {
    const std::string ready = base + "/ready";
    (void)store->add(ready, 1);
    for (const auto start = std::chrono::steady_clock::now(); store->add(ready, 0) < 2;) {
      drive();
      if (std::chrono::steady_clock::now() - start > options.timeout)
        throw TimeoutError(fmt::format("rank {}: moving {} to rank {} to {}: rank {} did not come to the move within {} ms", rank, what,
                                       peer, to.name(), peer, options.timeout.count()));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Replaces `ch`'s link (lane `L`) with a new one over `to`, as at setup (store keys under `key`),
  // and registers the same flags and staging slots (`inbox_kind` memory) with it: the signal
  // words keep their values, the channel its message counters.
  void reconnect(LaneState& L, detail::Channel& ch, Transport& to, const std::string& key, MemoryKind inbox_kind, const char* what) {
    const int peer = ch.peer;
    if (ch.link) ch.link->fence(FenceReason::HealthPolicy);
    {
      std::lock_guard lock(links_mutex);  // links() from another thread may be reading the old link
      ch.link.reset();
      ch.transport_name = std::string(to.name());
    }
    ch.peer_inbox = RemoteRegion{};
    ch.peer_flags = RemoteRegion{};
    ch.inbox_region = MemoryRegion{};
    ch.flags_region = MemoryRegion{};
    ch.transport = &to;
    const auto listener = to.listen();
    store->set(fmt::format("{}/addr/{}", key, rank), listener->address());
    const Bytes address = store->get(fmt::format("{}/addr/{}", key, peer), options.timeout);
    finish_connect(*to.connect(*listener, peer_info[static_cast<std::size_t>(peer)], address), ch,
                   std::chrono::steady_clock::now() + options.timeout,
                   fmt::format("rank {}: moving {} to rank {} to {}: connecting", rank, what, peer, to.name()));
    const std::size_t inbox_bytes = L.engine.slot_stride() * static_cast<std::size_t>(L.engine.slots);
    ch.flags_region = to.register_memory(L.flags_mem, detail::FlagBlock::bytes(size), MemoryKind::Host);
    ch.inbox_region = to.register_memory(ch.inbox, inbox_bytes, inbox_kind);
    store->set(fmt::format("{}/regions/{}", key, rank), pack({ch.inbox_region.key(), ch.flags_region.key()}));
    const auto parts = unpack(store->get(fmt::format("{}/regions/{}", key, peer), options.timeout), "region keys");
    RINGFENCE_EXPECTS(parts.size() == 2, "rank {}: malformed region keys from rank {} (moving {})", rank, peer, what);
    ch.peer_inbox = to.import_region(parts[0]);
    ch.peer_flags = to.import_region(parts[1]);
    ch.expected_gbps = to.can_reach(self, peer_info[static_cast<std::size_t>(peer)]).bandwidth_gbps;
    ch.judged.timeouts = ch.judged.link_timed_bytes = ch.judged.link_timed_ns = 0;  // the new link counts from zero
  }

  // Moves the device lane's link to `peer` to `to` (an agreed fence or move of the pair, see
  // move_device_links): as move_link, for the device lane alone, its staging slots registered
  // anew as device memory. Nothing of a device-lane call is in flight at an agreement (each
  // ends only once its links are idle: copies landed, signals stored), and the old link is
  // polled until both ends meet.
  void move_device_link(int peer, Transport& to) {
    LaneState& L = *device_lane;
    detail::Channel& ch = L.channel_to(peer);
    const LinkId l = LinkId::of(rank, peer);
    const std::string base = fmt::format("move/{}/{}-{}/device", seq, l.a, l.b);
    // The new link's streams and events belong to the lane's GPU (this may be any thread).
    make_lane_device_current(fmt::format("moving the device lane's link to rank {}", peer));
    meet_for_move(base, peer, to, "the device lane's link", [&] { poll_link(ch); });
    reconnect(L, ch, to, base, MemoryKind::Device, "the device lane's link");
  }

  // The device lane's side of an agreement: each of our device-lane links whose pair was agreed
  // fenced or moved moves to its device fallback (nvlink -> pcie by default) when there is one.
  // The host lanes re-plan or move as before; the device lane follows the plan's ring, so this
  // matters where the plan still uses the pair (relayed on the host lanes, or moved there).
  // Both ends decide alike: the same agreement, the same fallbacks, the same transport per pair.
  // `home`: the pairs were readmitted instead; their links move back to the first device
  // transport that reaches the peer (the one the lane would have been built with).
  void move_device_links(const std::vector<LinkId>& links, bool home = false) {
    if (!device_lane) return;
    for (const LinkId& l : links) {
      if (l.a != rank && l.b != rank) continue;
      const int peer = l.a == rank ? l.b : l.a;
      detail::Channel& ch = device_lane->channel_to(peer);
      Transport* to = home ? device_transport(peer) : device_fallback(ch.transport_name, peer);
      if (!to || to->name() == ch.transport_name) continue;
      const std::string detail = fmt::format("device lane: {}to {} (was {})", home ? "back " : "", to->name(), ch.transport_name);
      try {
        move_device_link(peer, *to);
      } catch (const Error& e) {
        record_failure(Status(e.code()), e.what());
        local_abort(e.code(), peer);
        abort_peers(e.code(), peer);
        throw;
      }
      log.warn("link {}-{} moved on the device lane at collective #{}: {}", l.a, l.b, seq, detail);
      emit(HealthEvent{EventKind::LinkMoved, rank, l.a, l.b, 0, 0, 0, detail, 0});
    }
  }

  // Applies agreed moves (link, index in `transports`): the ends move their links, every rank
  // judges the link afresh and reports it. Every rank runs it with the same list.
  void apply_moves(const std::vector<std::pair<LinkId, int>>& moves) {
    for (const auto& [l, t] : moves) {
      Transport& to = *transports[static_cast<std::size_t>(t)];
      std::string detail = fmt::format("to {}", to.name());
      if (l.a == rank || l.b == rank) {
        const int peer = l.a == rank ? l.b : l.a;
        detail += fmt::format(" (was {})", channel_to(peer).transport_name);
        try {
          move_link(peer, to);
        } catch (const Error& e) {
          record_failure(Status(e.code()), e.what());
          local_abort(e.code(), peer);
          abort_peers(e.code(), peer);  // the other ranks learn it at once instead of timing out
          throw;
        }
      }
      if (monitor) monitor->moved(l);
      moved_pairs.push_back(l);
      log.warn("link {}-{} moved {} at collective #{}: agreed by all ranks; the plan is unchanged", l.a, l.b, detail, seq);
      emit(HealthEvent{EventKind::LinkMoved, rank, l.a, l.b, 0, 0, 0, detail, 0});
    }
    ++epoch;
  }

  void setup(const TransportRegistry& registry) {
    RINGFENCE_EXPECTS(size >= 1, "Communicator: size must be >= 1 (got {})", size);
    RINGFENCE_EXPECTS(rank >= 0 && rank < size, "Communicator: rank {} is out of range for size {}", rank, size);
    RINGFENCE_EXPECTS(options.timeout.count() > 0, "rank {}: CommOptions::timeout must be positive", rank);
    RINGFENCE_EXPECTS(options.slots >= 1 && options.slots <= 64, "rank {}: CommOptions::slots must be in [1, 64] (got {})", rank,
                      options.slots);
    RINGFENCE_EXPECTS(options.chunk_bytes > 0, "rank {}: CommOptions::chunk_bytes must be positive", rank);
    RINGFENCE_EXPECTS(options.health_gpu >= CommOptions::kHealthGpuFromCuda,
                      "rank {}: CommOptions::health_gpu must be an NVML index, -1 (none) or kHealthGpuFromCuda (-2) (got {})",
                      rank, options.health_gpu);
    RINGFENCE_EXPECTS(store != nullptr, "rank {}: store must not be null", rank);
    log = Logger(options.log_level, rank);
    if (!options.health_log.empty()) {
      event_fd = ::open(options.health_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (event_fd < 0)
        throw SystemError(fmt::format("rank {}: cannot open RINGFENCE_HEALTH_LOG '{}': {}", rank, options.health_log,
                                      std::strerror(errno)),
                          errno);
    }

    self = PeerInfo{rank, options.host_id.empty() ? default_host_id() : options.host_id, static_cast<std::int32_t>(::getpid())};
    const TransportContext ctx{self, size, &options, &log};
    const std::vector<FaultRule> faults = parse_fault_spec(options.fault);
    for (const auto& name : registry.select(options.transports)) {
      auto t = registry.create(name, ctx);
      transports.push_back(faults.empty() ? std::move(t) : make_fault_transport(std::move(t), faults, rank));
    }
    if (!faults.empty()) log.warn("fault injection active: {}", options.fault);
    RINGFENCE_EXPECTS(!transports.empty(), "rank {}: no transports registered", rank);

    engine.rank = rank;
    engine.size = size;
    engine.slots = options.slots;
    engine.slot_bytes = std::max<std::size_t>(64, (options.chunk_bytes + 63) / 64 * 64);
    engine.timeout = options.timeout;
    engine.checksum = options.checksum;
    // The link map's syntax is checked before anything connects.
    bool automatic_map = false;
    std::vector<detail::LinkSource> link_map = detail::parse_link_map(options.health_link_map, &automatic_map);
    const std::vector<health::NvLinkPeer> own_nvlinks = read_gpu_topology();
    log.info("rank {}/{} on host '{}': transports {}, chunk {} B x {} slots, timeout {} ms", rank, size, self.host_id,
             fmt::join(registry.select(options.transports), ","), engine.slot_bytes, engine.slots, options.timeout.count());

    if (size == 1) return;
    votes.resize(2 * static_cast<std::size_t>(size) * static_cast<std::size_t>(size));
    digests.resize(static_cast<std::size_t>(size));

    // A channel to every peer (one host, small rank counts): re-planning the ring around a
    // fenced link then needs no new connections. With two ranks left == right: one channel
    // carries both directions.
    for (int p = 0; p < size; ++p)
      if (p != rank) channel_to(p);

    channel_of.assign(static_cast<std::size_t>(size), nullptr);
    for (auto& ch : channels) channel_of[static_cast<std::size_t>(ch->peer)] = ch.get();

    // 1. Publish who we are; learn who the neighbours are.
    store->set(fmt::format("peer/{}", rank), serialize(self));
    std::vector<PeerInfo> peers;
    for (auto& ch : channels) {
      PeerInfo p = deserialize_peer_info(store->get(fmt::format("peer/{}", ch->peer), options.timeout));
      RINGFENCE_EXPECTS(p.rank == ch->peer, "rank {}: the store holds inconsistent peer info for rank {}", rank, ch->peer);
      peers.push_back(std::move(p));
    }

    // 2. Choose a transport per neighbour: the first (highest priority) that reaches it. Both
    //    ends evaluate the same list on the same facts, so they agree.
    std::size_t min_chunk = 0;  // the largest chunk preference of the chosen transports
    for (std::size_t i = 0; i < channels.size(); ++i) {
      std::string reasons;
      for (std::size_t t = 0; t < transports.size(); ++t) {
        const Reachability r = transports[t]->can_reach(self, peers[i]);
        if (r.ok) {
          channels[i]->transport = transports[t].get();
          channels[i]->expected_gbps = r.bandwidth_gbps;
          min_chunk = std::max(min_chunk, r.min_chunk_bytes);
          channels[i]->transport_name = std::string(transports[t]->name());
          break;
        }
        reasons += fmt::format(" {}: {};", transports[t]->name(), r.reason);
      }
      if (!channels[i]->transport)
        throw Error(ErrorCode::PeerUnreachable,
                    fmt::format("rank {}: no transport reaches rank {}:{}", rank, channels[i]->peer, reasons));
    }

    peer_info.assign(static_cast<std::size_t>(size), self);
    for (const auto& p : peers) peer_info[static_cast<std::size_t>(p.rank)] = p;

    if (engine.checksum || !options.health_link_map.empty()) {
      // With checksums every link of this rank is judged on its transport's evidence too.
      std::vector<LinkId> own;
      if (engine.checksum)
        for (int p = 0; p < size; ++p)
          if (p != rank) own.push_back(LinkId::of(rank, p));
      if (automatic_map) {
        std::vector<detail::LinkSource> found = nvlink_map(own_nvlinks);
        link_map.insert(link_map.end(), found.begin(), found.end());
      }
      monitor = std::make_unique<detail::HealthMonitor>(options.health, std::move(link_map), std::move(own), log);
      observations.reserve(static_cast<std::size_t>(size));
      timed.reserve(static_cast<std::size_t>(size));
    }
    fallback_of.assign(static_cast<std::size_t>(size), -1);
    for (auto& ch : channels) fallback_of[static_cast<std::size_t>(ch->peer)] = fallback_for(*ch);

    // A transport may want larger chunks (tcp: each chunk costs a wake-up and a signal round).
    // Every rank sees the same links' preferences (a job spread over hosts gives every rank a
    // network link); the fingerprint checks it.
    if (min_chunk > engine.slot_bytes) engine.slot_bytes = (min_chunk + 63) / 64 * 64;
    oneshot_copy.resize(engine.slot_bytes);

    // 3-4. Connect lane 0, then the extra lanes (RINGFENCE_CHANNELS), each with its own links,
    //      flags and staging slots; the same transport per peer on every lane.
    planned_lanes = lane_count(peers);
    connect_lane(*this, 0, peers);
    for (int c = 1; c < planned_lanes; ++c) {
      auto lane = std::make_unique<LaneState>();
      lane->engine = engine;
      for (auto& ch : channels) {
        detail::Channel& mine = lane->channel_to(ch->peer);
        mine.transport = ch->transport;
        mine.transport_name = ch->transport_name;
        mine.expected_gbps = ch->expected_gbps;
      }
      connect_lane(*lane, c, peers);
      extra_lanes.push_back(std::move(lane));
    }
    // The heartbeat's own links (one per peer, tiny staging), driven only by its thread.
    if (options.effective_heartbeat().count() > 0) {
      beat_lane = std::make_unique<LaneState>();
      beat_lane->engine = engine;
      beat_lane->engine.slots = 1;
      beat_lane->engine.slot_bytes = 64;
      for (auto& ch : channels) {
        detail::Channel& mine = beat_lane->channel_to(ch->peer);
        mine.transport = ch->transport;
        mine.transport_name = ch->transport_name;
      }
      connect_lane(*beat_lane, kBeatLane, peers);
    }
    // The home ring: each host's ranks next to each other (hosts in order of their lowest rank),
    // so a ring crosses between hosts once per host and direction; within a host NVLink-joined
    // (or same-GPU) ranks are neighbours where the GPUs are known, else ranks ascend (one host:
    // 0, 1, ..., n-1). Every rank derives it from the same peer list (`plan_home_ring`).
    std::vector<RankPlacement> placement;
    placement.reserve(peer_info.size());
    for (const PeerInfo& p : peer_info) placement.push_back(placement_of(p));
    home_ring = plan_home_ring(placement);
    int joined_hops = 0;
    for (int i = 0; i < size; ++i)
      joined_hops += gpu_joined(placement, home_ring[static_cast<std::size_t>(i)], home_ring[static_cast<std::size_t>((i + 1) % size)]);
    if (joined_hops > 0)
      log.info("planner: home ring {} ({} of {} hops NVLink or same GPU)", fmt::join(home_ring, ","), joined_hops, size);
    int hosts = 0;  // distinct host ids
    for (auto it = peer_info.begin(); it != peer_info.end(); ++it)
      hosts += std::none_of(peer_info.begin(), it, [&](const PeerInfo& q) { return q.host_id == it->host_id; });
    // The tuner's model: across hosts, or with no shared-memory transport selected, the slowest
    // hop is a network link (tcp's figures). Both are the same on every rank (host ids are
    // global; the transport selection is in the protocol fingerprint).
    tuner_model = TunerModel{options.tuner_alpha_us, options.tuner_gbps};
    if (hosts > 1 || network_only()) {
      tuner_model.alpha_us = std::max(tuner_model.alpha_us, kInterHostAlphaUs);
      tuner_model.gbps = std::min(tuner_model.gbps, kInterHostGbps);
    }
    set_ring(home_ring);
    start_lane_workers();

    // 5. Everyone is wired: the store is no longer needed by this communicator's data path.
    store_barrier("setup");
    if (monitor) monitor->start(options.health_interval);
    if (beat_lane) start_heartbeat();
    log.info("connected: left rank {} over {}, right rank {} over {}", left->peer, left->transport_name, right->peer,
             right->transport_name);
  }

  // This rank's GPU (`RINGFENCE_HEALTH_GPU`: an NVML index, none = -1, or the CUDA device) as
  // NVML sees it: its PCI bus id, the far ends of its active NVLinks and the count of those that
  // end at an NVSwitch go into `self` (every rank learns them with the peer info, for the planner
  // and the automatic link map); returns the NVLinks with their indices (for the map). NVML
  // unavailable or no bus id: unknown, with a warning.
  std::vector<health::NvLinkPeer> read_gpu_topology() {
    if (options.health_gpu == -1 || size == 1) return {};
    const health::NvmlSource nvml(options.health.nvml_library);
    if (!nvml.available()) {
      log.warn("RINGFENCE_HEALTH_GPU={} but NVML is unavailable ({}): no NVLink is planned for or mapped",
               options.health_gpu == CommOptions::kHealthGpuFromCuda ? std::string("cuda") : std::to_string(options.health_gpu),
               nvml.unavailable_reason());
      return {};
    }
    if (options.health_gpu == CommOptions::kHealthGpuFromCuda) {
      const std::optional<unsigned> found = nvml_index_of_cuda_device(nvml);
      if (!found) return {};
      nvml_gpu = static_cast<int>(*found);
    } else {
      nvml_gpu = options.health_gpu;
    }
    const auto gpu = static_cast<unsigned>(nvml_gpu);
    const auto id = nvml.pci_bus_id(gpu);
    if (!id) {
      log.warn("NVML has no PCI bus id for GPU {} (RINGFENCE_HEALTH_GPU): no NVLink is planned for or mapped", gpu);
      return {};
    }
    std::vector<health::NvLinkPeer> links = nvml.nvlink_peers(gpu);
    self.gpu_bus_id = *id;
    for (const auto& l : links) {
      if (l.far_end == health::NvLinkFarEnd::Switch)
        ++self.nvswitch_links;
      else
        self.nvlink_bus_ids.push_back(l.remote_bus_id);
    }
    return links;
  }

  // `RINGFENCE_HEALTH_GPU=cuda`: the NVML index of the CUDA device current on this thread, found
  // by its PCI bus id (CUDA orders devices fastest first, or as CUDA_VISIBLE_DEVICES says; NVML
  // by bus id). Anything missing is a warning and leaves the GPU unknown, like NVML missing.
  std::optional<unsigned> nvml_index_of_cuda_device(const health::NvmlSource& nvml) {
    const detail::CudaApi cuda = detail::load_cuda_api(options.cuda_runtime);
    auto unknown = [&](const std::string& why) {
      log.warn("RINGFENCE_HEALTH_GPU=cuda but {}: no NVLink is planned for or mapped", why);
      return std::nullopt;
    };
    if (!cuda.usable) return unknown(fmt::format("no usable CUDA runtime ({})", cuda.why_not));
    if (cuda.get_device == nullptr || cuda.device_get_pci_bus_id == nullptr)
      return unknown(fmt::format("{} lacks cudaGetDevice or cudaDeviceGetPCIBusId", cuda.library));
    int device = -1;
    if (const int err = cuda.get_device(&device); err != detail::kCudaSuccess) return unknown(cuda.describe("cudaGetDevice", err));
    char bus[64] = {};
    if (const int err = cuda.device_get_pci_bus_id(bus, static_cast<int>(sizeof bus) - 1, device); err != detail::kCudaSuccess)
      return unknown(cuda.describe("cudaDeviceGetPCIBusId", err));
    const std::optional<unsigned> index = nvml.index_of_bus_id(bus);
    if (!index) return unknown(fmt::format("NVML has no GPU with the bus id '{}' of CUDA device {}", bus, device));
    log.info("RINGFENCE_HEALTH_GPU=cuda: CUDA device {} ({}) is NVML GPU {}", device, bus, *index);
    return index;
  }

  // `RINGFENCE_HEALTH_LINK_MAP=auto`: maps each active NVLink of this rank's GPU whose far end is
  // another rank's GPU (bus ids from the peer info) to the link with that rank.
  std::vector<detail::LinkSource> nvlink_map(const std::vector<health::NvLinkPeer>& links) {
    const std::string& bus = self.gpu_bus_id;
    std::vector<std::string> bus_of(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) bus_of[static_cast<std::size_t>(r)] = peer_info[static_cast<std::size_t>(r)].gpu_bus_id;
    std::vector<detail::LinkSource> out;
    for (const auto& e : health::nvlink_edges(rank, static_cast<unsigned>(std::max(nvml_gpu, 0)), links, bus_of))
      out.push_back(detail::LinkSource{LinkId::of(rank, e.peer), detail::LinkSource::Kind::Nvml, std::to_string(e.gpu),
                                       static_cast<int>(e.link)});
    log.info("health: NVLink map of GPU {} ({}): {} link(s) to other ranks", nvml_gpu, bus.empty() ? "none" : bus,
             out.size());
    return out;
  }

  // True when [ptr, ptr+bytes) lies in memory from alloc() (shareable without copies).
  bool is_allocated(const void* ptr, std::size_t bytes) const noexcept {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    for (const auto& a : user_allocs)
      if (p >= a.first && p + bytes <= a.first + a.second) return true;
    return false;
  }

  // True when no selected transport shares memory: every link is a network link.
  bool network_only() const noexcept {
    return std::none_of(transports.begin(), transports.end(), [](const auto& t) { return t->shares_memory(); });
  }

  std::string protocol_fingerprint() const {
    return fmt::format(
        "v1 slot_bytes={} slots={} direct_write_min_bytes={} checksum={} agree_every={} agreement={} digest_every={} "
        "algo={} tuner={}/{}{} channels={}/{} check_calls={} heartbeat={}",
        engine.slot_bytes, engine.slots, options.direct_write_min_bytes, engine.checksum, options.health_agree_every,
        agreement_enabled(), options.digest_every, static_cast<int>(options.algorithm), options.tuner_alpha_us,
        options.tuner_gbps, network_only() ? "/network" : "", planned_lanes, options.channel_min_bytes, options.check_calls,
        options.effective_heartbeat().count() > 0);  // the user threshold may differ per rank
  }

  // Key of `ptr` registered with `t` (our output buffer, written by the left neighbour).
  std::span<const std::byte> output_key(void* ptr, std::size_t bytes, Transport* t) {
    for (auto& e : local_regs)
      if (e.ptr == ptr && e.bytes == bytes) return e.key;
    if (local_regs.size() == kRegCacheEntries) local_regs.pop_front();
    MemoryRegion region = t->register_memory(ptr, bytes, MemoryKind::Host);
    Bytes key = region.key();
    local_regs.push_back(LocalReg{ptr, bytes, std::move(region), std::move(key)});
    return local_regs.back().key;
  }

  static const RemoteRegion* resolve_remote(void* ctx, std::span<const std::byte> key) noexcept {
    auto& self = *static_cast<Impl*>(ctx);
    return self.import_cached(key, *self.right);
  }

  // Imports a peer's key with `ch`'s transport, through a bounded cache (a hit allocates
  // nothing). A group uses at most one key per peer at a time, far below the cache size.
  const RemoteRegion* import_cached(std::span<const std::byte> key, detail::Channel& ch) noexcept {
    std::lock_guard lock(regs_mutex);  // lanes resolve their neighbours' keys at once
    for (auto& e : remote_regs)
      if (std::equal(e.key.begin(), e.key.end(), key.begin(), key.end())) return &e.region;
    try {
      if (remote_regs.size() == std::max<std::size_t>(kRegCacheEntries, 2 * static_cast<std::size_t>(size))) remote_regs.pop_front();
      RemoteRegion region = ch.transport->import_region(key);
      remote_regs.push_back(RemoteReg{Bytes(key.begin(), key.end()), std::move(region)});
      return &remote_regs.back().region;
    } catch (const std::exception& e) {
      log.error("importing rank {}'s buffer failed: {}", ch.peer, e.what());
      return nullptr;
    }
  }

  // Point-to-point direct writes (see detail::P2PDirect).
  detail::P2PDirect p2p_direct(std::size_t user_min_bytes) noexcept {
    detail::P2PDirect d;
    d.enabled = !engine.checksum && size > 1;
    d.min_bytes = options.direct_write_min_bytes;
    d.user_min_bytes = user_min_bytes;
    d.ctx = this;
    d.key_of = [](const detail::P2PDirect& d, void* ptr, std::size_t bytes, detail::Channel& ch) noexcept -> std::span<const std::byte> {
      auto& self = *static_cast<Impl*>(d.ctx);
      if (!self.is_allocated(ptr, bytes) && bytes < d.user_min_bytes && !ch.transport->cheap_user_writes()) return {};
      try {
        return self.output_key(ptr, bytes, ch.transport);
      } catch (const std::exception& e) {  // not shareable: the sender uses our staging slots
        self.log.debug("receive buffer not shareable with rank {} ({}): staging", ch.peer, e.what());
        return {};
      }
    };
    d.resolve = [](void* ctx, std::span<const std::byte> key, detail::Channel& ch) noexcept {
      return static_cast<Impl*>(ctx)->import_cached(key, ch);
    };
    return d;
  }

  // Installs a plan: the logical ring and the relays that carry its fenced hops. Called
  // between collectives only (every channel is quiescent for this rank).
  void set_ring(std::vector<int> order, std::vector<Relay> new_relays = {}) {
    ring = std::move(order);
    relays = std::move(new_relays);
    auto position_of = [&](int r) {
      return static_cast<std::size_t>(std::find(ring.begin(), ring.end(), r) - ring.begin());
    };
    const std::size_t pos = position_of(rank), n = ring.size();
    for_each_lane([&](LaneState& L) {
      L.relay_duties = detail::RelayDuties{};
      L.engine.trailers = !relays.empty();
      if (size == 1) return;
      L.engine.position = static_cast<int>(pos);
      int left_rank = ring[(pos + n - 1) % n], right_rank = ring[(pos + 1) % n];
      for (const Relay& r : relays) {
        if (r.to == rank) left_rank = r.via;     // our logical left's chunks come through the relay
        if (r.from == rank) right_rank = r.via;  // ours go through it
        if (r.via == rank && L.relay_duties.count < detail::kMaxRelayDuties) {
          detail::RelayDuty& d = L.relay_duties.duty[L.relay_duties.count++];
          d.in = &L.channel_to(r.from);
          d.out = &L.channel_to(r.to);
          d.sender_position = static_cast<int>(position_of(r.from));
          d.base_in = d.in->received;
          d.base_out = d.out->sent;
          d.credited = static_cast<std::uint32_t>(d.base_in);
        }
      }
      L.left = &L.channel_to(left_rank);
      L.right = &L.channel_to(right_rank);
    });
    if (size == 1) return;
    // Call fingerprints go along the ring: each rank checks the nearest rank before it whose
    // link to it is not fenced (the same pairs on every rank: same ring, same fence list).
    fp_from = nullptr;
    fp_to.clear();
    for (std::size_t p = 0; p < n; ++p) {
      int source = -1;
      for (std::size_t d = 1; d < n && source < 0; ++d)
        if (const int q = ring[(p + n - d) % n]; !is_fenced(q, ring[p])) source = q;
      if (ring[p] == rank && source >= 0) fp_from = &channel_to(source);
      if (source == rank) fp_to.push_back(&channel_to(ring[p]));
    }
    // Trees name peers by ring position; they run only on plans without relays whose tree
    // edges avoid every fenced link.
    position_channel.assign(n, nullptr);
    for (std::size_t p = 0; p < n; ++p)
      if (ring[p] != rank) position_channel[p] = &channel_to(ring[p]);
    tree_allowed = relays.empty();
    for (int t = 0; t < 2 && tree_allowed; ++t)
      for (int p = 0; p < static_cast<int>(n) && tree_allowed; ++p) {
        const int parent = double_tree_node(t, p, static_cast<int>(n)).parent;
        if (parent >= 0 && is_fenced(ring[static_cast<std::size_t>(p)], ring[static_cast<std::size_t>(parent)])) tree_allowed = false;
      }
  }

  // The plan for `all` fenced links starting from ring `base`: relays when they exist (the
  // logical ring and every element's reduction order stay, so results stay bit-identical),
  // else a re-ordered ring; nullopt when neither avoids the links. Every rank computes the
  // same plan from the same list.
  static std::optional<std::pair<std::vector<int>, std::vector<Relay>>> plan_for(const std::vector<int>& base,
                                                                                   const std::vector<LinkId>& all, int n) {
    if (auto relayed = plan_relays(base, all)) return std::pair{base, std::move(*relayed)};
    if (auto reordered = plan_ring(n, all)) return std::pair{std::move(*reordered), std::vector<Relay>{}};
    return std::nullopt;
  }

  // Switches to `plan` with `all` fenced: fences this rank's newly fenced links, reopens its
  // readmitted ones, rebuilds the ring and bumps the epoch.
  void install_plan(std::pair<std::vector<int>, std::vector<Relay>> plan, std::vector<LinkId> all,
                    const std::vector<LinkId>& added, const std::vector<LinkId>& readmitted) {
    fenced = std::move(all);
    for_each_lane([&](LaneState& L) {
      for (const auto& l : added)
        if (l.a == rank || l.b == rank) L.channel_to(l.a == rank ? l.b : l.a).link->fence(FenceReason::HealthPolicy);
      for (const auto& l : readmitted)
        if (l.a == rank || l.b == rank) L.channel_to(l.a == rank ? l.b : l.a).link->reopen();
    });
    set_ring(std::move(plan.first), std::move(plan.second));
    ++epoch;
  }

  // Installs an agreed fence list at setup (shrink carries fences over): the same planning as
  // an agreement, without the vote. Throws LinkFencedError when no plan avoids them.
  void install_fences(std::vector<LinkId> all) {
    auto plan = plan_for(ring, all, size);
    if (!plan)
      throw LinkFencedError(fmt::format("rank {}: no ring of {} ranks avoids the fenced links {}", rank, size, to_string(all)), rank,
                            all.front().a == rank ? all.front().b : all.front().a);
    const std::vector<LinkId> added = all;
    install_plan(std::move(*plan), std::move(all), added, {});
  }

  // Fence agreement at a collective boundary (design §5.4): every rank contributes the links it
  // wants fenced (vote 2) and the fenced links it finds fit to come back (vote 1); a checksummed
  // allreduce (max) of the n x n matrix gives every rank the same result, so every rank fences
  // and readmits the same links and switches to the same plan before the next collective. A
  // fence vote dominates a readmission vote. A second n x n matrix carries, in row r, the
  // transport each of r's links may move to (CommOptions::fallbacks): a link to fence whose two
  // ends name the same one moves there instead (apply_moves) and the plan stays. Returns Ok or
  // the failure of the internal allreduce; a move that fails throws.
  Status agree(detail::Failure& failure) {
    constexpr std::uint8_t kReadmit = 1, kFence = 2;
    // `votes` is preallocated (n x n, upper triangle used).
    std::fill(votes.begin(), votes.end(), std::uint8_t{0});
    auto vote = [&](LinkId l, std::uint8_t v) {
      std::uint8_t& slot = votes[static_cast<std::size_t>(l.a * size + l.b)];
      slot = std::max(slot, v);
    };
    auto is_fenced_link = [&](LinkId l) { return is_fenced(l.a, l.b); };
    auto propose = [&](LinkId l, std::uint64_t count, const std::string& why) {
      vote(l, kFence);
      log.warn("proposing to fence link {}-{}: {}", l.a, l.b, why);
      emit(HealthEvent{EventKind::FenceProposed, rank, l.a, l.b, 0, 0, count, why, 0});
    };
    // Proposals and readmissions come from the links' policies: this rank's links judged on
    // what the transport saw since the last agreement (checksum mismatches, intact chunks,
    // timeouts, achieved bandwidth), mapped links on their hardware counters as well.
    if (monitor) {
      // One observation per peer, summed over the lanes (each lane has its own link to it).
      observations.clear();
      for (auto& ch : channels) observations.push_back(detail::TransportObservation{LinkId::of(rank, ch->peer)});
      timed.assign(channels.size(), {0, 0});
      // What channel `ch` saw since the last agreement, into `o` and its timed traffic `t`.
      auto judge = [](detail::Channel& ch, detail::TransportObservation& o, std::pair<std::uint64_t, std::uint64_t>& t) {
        auto& j = ch.judged;
        const LinkStats& st = ch.link->stats();
        const std::uint64_t timeouts = st.timeouts.load(std::memory_order_relaxed);
        const std::uint64_t link_bytes = st.timed_bytes.load(std::memory_order_relaxed);
        const std::uint64_t link_ns = st.timed_ns.load(std::memory_order_relaxed);
        const std::uint64_t checksum_errors = ch.checksum_errors.load(std::memory_order_relaxed);
        o.checksum_mismatches += checksum_errors - j.checksum_errors;
        o.successes += (ch.sent - j.sent) + (ch.received - j.received);
        o.timeouts += timeouts - j.timeouts;
        t.first += (ch.timed_bytes - j.timed_bytes) + (link_bytes - j.link_timed_bytes);
        t.second += (ch.timed_ns - j.timed_ns) + (link_ns - j.link_timed_ns);
        j = {checksum_errors, ch.sent, ch.received, ch.timed_bytes, ch.timed_ns, timeouts, link_bytes, link_ns};
      };
      // Bytes over time spent in writes: the speed of one write stream, against the transport's.
      auto ratio = [](const std::pair<std::uint64_t, std::uint64_t>& t, double expected_gbps) -> std::optional<double> {
        if (t.first < kBandwidthEvidenceBytes || t.second == 0 || expected_gbps <= 0) return std::nullopt;
        return static_cast<double>(t.first) / static_cast<double>(t.second) / expected_gbps;
      };
      for_each_lane([&](LaneState& L) {
        for (std::size_t i = 0; i < L.channels.size(); ++i) judge(*L.channels[i], observations[i], timed[i]);
      });
      for (std::size_t i = 0; i < channels.size(); ++i) observations[i].bandwidth_ratio = ratio(timed[i], channels[i]->expected_gbps);
      // The device lane's links join their pair's evidence: chunks, timeouts and their own
      // bandwidth (device copies timed with CUDA events, against the device transport's figure);
      // the slower of the two paths judges the pair.
      // Its channels are in lane 0's order (use_device_lane builds them so).
      if (device_lane)
        for (std::size_t i = 0; i < channels.size(); ++i) {
          detail::Channel& dch = *device_lane->channels[i];
          std::pair<std::uint64_t, std::uint64_t> t{0, 0};
          auto& o = observations[i];
          judge(dch, o, t);
          if (const auto r = ratio(t, dch.expected_gbps)) o.bandwidth_ratio = std::min(o.bandwidth_ratio.value_or(*r), *r);
        }
      for (std::size_t i = 0; i < channels.size(); ++i) {
        auto& o = observations[i];
        if (o.checksum_mismatches > 0)
          emit(HealthEvent{EventKind::ChecksumErrors, rank, o.link.a, o.link.b, 0, 0, o.checksum_mismatches, {}, 0});
      }
      for (const auto& a : monitor->evaluate(std::chrono::steady_clock::now(), observations)) {
        if (a.link.b >= size) continue;
        if (a.change && a.change->to == health::LinkState::Suspect)
          emit(HealthEvent{EventKind::LinkSuspect, rank, a.link.a, a.link.b, 0, 0, 0, a.why, 0});
        if (a.change && a.change->to == health::LinkState::Healthy)
          emit(HealthEvent{EventKind::LinkHealthy, rank, a.link.a, a.link.b, 0, 0, 0, a.why, 0});
        if (a.state == health::LinkState::Fenced) {
          if (is_fenced_link(a.link)) vote(a.link, kFence);  // still serving its cool-down
          else propose(a.link, 0, a.why);
        } else if (is_fenced_link(a.link)) {
          vote(a.link, kReadmit);  // cool-down served, nothing wrong since: probation in the plan
        }
      }
    }
    // Where each of our links may move instead of being fenced (row `rank` of the second matrix).
    const std::size_t nn = static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
    for (int p = 0; p < size; ++p)
      if (p != rank) votes[nn + static_cast<std::size_t>(rank * size + p)] = static_cast<std::uint8_t>(fallback_of[static_cast<std::size_t>(p)] + 1);
    // An end whose transport cannot resume a fenced link keeps it fenced.
    for (const LinkId& l : fenced)
      if (l.a == rank || l.b == rank)
        if (!channel_to(l.a == rank ? l.b : l.a).link->can_reopen()) vote(l, kFence);

    detail::EngineConfig config = engine;
    config.checksum = true;  // the votes themselves must not be corrupted on the way
    const Reducer max = host_reducer(DataType::Uint8, ReduceOp::Max);
    RINGFENCE_TRY(detail::run_ring_allreduce(config, flags, left, right, votes.data(), votes.data(), votes.size(), max,
                                             detail::DirectWrite{}, relay_duties, failure));
    std::vector<LinkId> added, readmitted;
    std::vector<std::pair<LinkId, int>> moves;  // links to fence whose ends both may move them: to which transport
    for (int a = 0; a < size; ++a)
      for (int b = a + 1; b < size; ++b) {
        const std::uint8_t v = votes[static_cast<std::size_t>(a * size + b)];
        const LinkId l{a, b};
        const bool known_unroutable = std::find(unroutable.begin(), unroutable.end(), l) != unroutable.end();
        const std::uint8_t to_a = votes[nn + static_cast<std::size_t>(a * size + b)], to_b = votes[nn + static_cast<std::size_t>(b * size + a)];
        if (v == kFence && !is_fenced_link(l) && !known_unroutable) {
          if (to_a != 0 && to_a == to_b) moves.emplace_back(l, to_a - 1);
          else added.push_back(l);
        }
        if (v == kReadmit && is_fenced_link(l)) readmitted.push_back(l);
      }
    if (!moves.empty()) apply_moves(moves);
    if (device_lane && (!moves.empty() || !added.empty())) {
      std::vector<LinkId> bad = added;
      for (const auto& m : moves) bad.push_back(m.first);
      move_device_links(bad);
    }
    if (added.empty() && readmitted.empty()) return Status::ok();

    // Every rank holds the same votes, so every rank computes the same plan. Prefer relays: the
    // logical ring (and every element's reduction order) stays, so results stay bit-identical
    // to the unfenced plan. Otherwise re-order the ring; with neither, fail everywhere alike.
    // When links come back the plan starts again from rank order, so a job whose fences all
    // healed runs the original plan again.
    std::vector<LinkId> all;
    for (const LinkId& l : fenced)
      if (std::find(readmitted.begin(), readmitted.end(), l) == readmitted.end()) all.push_back(l);
    all.insert(all.end(), added.begin(), added.end());
    const std::vector<int> base = readmitted.empty() ? ring : home_ring;
    auto next = plan_for(base, all, size);
    if (!next) {
      // No route around: the links stay in use, degraded, with end-to-end checksums on every
      // rank from this collective (switched on together: every rank decides from the same
      // votes), so every chunk is verified and re-sent when damaged and results stay exact.
      // Failing the job instead would stop training on a link that still delivers.
      unroutable.insert(unroutable.end(), added.begin(), added.end());
      const bool was_checked = engine.checksum;
      for_each_lane([](LaneState& L) { L.engine.checksum = true; });
      const std::string message = fmt::format(
          "links {} must be fenced (agreed by all ranks) but neither a relay nor a ring of {} ranks avoids {}: they stay in use, "
          "degraded, with end-to-end checksums{} (every chunk verified, re-sent when damaged); shrink the communicator or "
          "replace the hardware",
          to_string(added), size, to_string(all), was_checked ? "" : " switched on");
      log.error("collective #{}: {}", seq, message);
      for (const auto& l : added) emit(HealthEvent{EventKind::NoPlan, rank, l.a, l.b, 0, 0, 0, message, 0});
      if (readmitted.empty()) return Status::ok();
      // Readmissions still apply (the plan without the unroutable links changes nothing else).
      all.clear();
      for (const LinkId& l : fenced)
        if (std::find(readmitted.begin(), readmitted.end(), l) == readmitted.end()) all.push_back(l);
      next = plan_for(home_ring, all, size);
      if (!next) return Status::ok();
      added.clear();
    }
    install_plan(std::move(*next), std::move(all), added, readmitted);
    move_device_links(readmitted, /*home=*/true);
    if (monitor) {  // a fenced link serves a cool-down before it may come back
      const auto now = std::chrono::steady_clock::now();
      for (const auto& l : added) monitor->fence(l, "fenced by agreement", now);
    }
    const std::string plan = relays.empty() ? fmt::format("{}", fmt::join(ring, "-"))
                                            : fmt::format("{} relays {}", fmt::join(ring, "-"), to_string(relays));
    for (const auto& l : added) emit(HealthEvent{EventKind::LinkFenced, rank, l.a, l.b, 0, 0, 0, "agreed by all ranks", 0});
    for (const auto& l : readmitted)
      emit(HealthEvent{EventKind::LinkReadmitted, rank, l.a, l.b, 0, 0, 0, "cool-down served, counters clean; agreed by all ranks", 0});
    emit(HealthEvent{EventKind::Replanned, rank, -1, -1, 0, 0, 0, plan, 0});
    if (!added.empty()) log.warn("fenced link {} at collective #{}; epoch {}: ring {}", to_string(added), seq, epoch, plan);
    if (!readmitted.empty())
      log.warn("readmitted link {} at collective #{}; epoch {}: ring {}", to_string(readmitted), seq, epoch, plan);
    return Status::ok();
  }

  // Rewrites the Prometheus text file (tmp + rename: scrapers never see half a file).
  void write_prometheus(const HealthSnapshot& h) noexcept {
    if (options.health_prometheus.empty()) return;
    try {
      std::string path = options.health_prometheus;
      if (const auto at = path.find("{rank}"); at != std::string::npos) path.replace(at, 6, std::to_string(rank));
      const std::string tmp = path + ".tmp";
      {
        std::ofstream out(tmp, std::ios::trunc);
        out << h.prometheus();
        if (!out) throw std::runtime_error("write failed");
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(std::strerror(errno));
    } catch (const std::exception& e) {
      log.warn("cannot write RINGFENCE_HEALTH_PROMETHEUS file: {}", e.what());
    }
  }

  void check_usable(const char* call) const {
    if (!failed.load(std::memory_order_acquire)) return;
    std::lock_guard lock(status_mutex);
    if (!failure.is_ok())
      throw_status(failure, fmt::format("rank {}: {} on a communicator that already failed: {}", rank, call, failure_message));
  }

  // Tells every peer that this rank failed, so ranks waiting on others fail at once with a
  // message naming us instead of running into their own timeouts. Best effort, never throws.
  void abort_peers(ErrorCode code, int blamed) noexcept {
    const std::uint32_t value = detail::FlagBlock::abort_value(code, rank, blamed);
    for_each_lane_and_device([&](LaneState& L) {
      for (auto& ch : L.channels) {
        if (!ch->link || !ch->peer_flags) continue;
        (void)ch->link->signal(SignalOp{&ch->peer_flags, detail::FlagBlock::abort_offset(size), value, 0});
        Completion done[8];
        std::size_t n = 0;
        (void)ch->link->poll(done, n);
      }
    });
  }

  // ---- argument checks shared by every call (InvalidUsage naming the argument and rank) ----
  void check_type(const char* call, DataType type) const {
    RINGFENCE_EXPECTS(is_valid(type), "rank {}: {}: invalid datatype value {}", rank, call, static_cast<int>(type));
  }
  void check_op(const char* call, ReduceOp op) const {
    RINGFENCE_EXPECTS(is_valid(op), "rank {}: {}: invalid reduce op value {}", rank, call, static_cast<int>(op));
  }
  // Bytes of `count` elements times `blocks`, refusing overflow.
  std::size_t bytes_of(const char* call, const char* what, std::size_t count, DataType type, std::size_t blocks = 1) const {
    const std::size_t elem = size_of(type);
    RINGFENCE_EXPECTS(count <= static_cast<std::size_t>(PTRDIFF_MAX) / elem / blocks,
                      "rank {}: {}: {} {} of {} (x {} blocks) overflows the address space", rank, call, what, count, to_string(type),
                      blocks);
    return count * elem * blocks;
  }
  void check_pointer(const char* call, const char* what, const void* p, std::size_t bytes) const {
    RINGFENCE_EXPECTS(bytes == 0 || p != nullptr, "rank {}: {}: {} is null with {} bytes to move", rank, call, what, bytes);
  }
  // Buffers must be disjoint, or `send` exactly at `in_place_at` (the call's in-place form).
  // sendbuff and recvbuff may overlap only in the call's in-place form (`in_place`; `form`
  // describes it for the error, with the address `at` it asks for; null: the call has none).
  void check_overlap(const char* call, const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes,
                     bool in_place, const char* form, const void* at) const {
    if (send_bytes == 0 || recv_bytes == 0 || !send || !recv || in_place) return;
    const auto a = reinterpret_cast<std::uintptr_t>(send), b = reinterpret_cast<std::uintptr_t>(recv);
    RINGFENCE_EXPECTS(a + send_bytes <= b || b + recv_bytes <= a,
                      "rank {}: {}: sendbuff {} ({} bytes) and recvbuff {} ({} bytes) overlap without being the in-place form{}",
                      rank, call, send, send_bytes, recv, recv_bytes,
                      form ? fmt::format(" ({}, here {})", form, at) : std::string(" (none for this call)"));
  }
  void check_root(const char* call, int root) const {
    RINGFENCE_EXPECTS(root >= 0 && root < size, "rank {}: {}: root {} is out of range [0, {})", rank, call, root, size);
  }
  void check_peer(const char* call, int peer) const {
    RINGFENCE_EXPECTS(peer >= 0 && peer < size, "rank {}: {}: peer {} is out of range [0, {})", rank, call, peer, size);
  }
  int position_of(int r) const noexcept {
    return static_cast<int>(std::find(ring.begin(), ring.end(), r) - ring.begin());
  }

  // Every collective starts here: refuse a broken communicator or a call inside a group, count
  // the call, and run the fence agreement when it is due.
  void begin_collective(const char* call, detail::CallFingerprint fp) {
    check_usable(call);
    if (peers_left.load(std::memory_order_acquire) > 0) {
      // Point-to-point between the others could go on; a collective never can again. Name every
      // rank that left: one that failed on the first leaver and closed in turn may be seen too.
      std::vector<int> left_ranks;
      for (int r = 0; r < size; ++r)
        if (r != rank && peer_left[static_cast<std::size_t>(r)].load(std::memory_order_acquire)) left_ranks.push_back(r);
      if (!left_ranks.empty()) {
        const std::string why =
            left_ranks.size() == 1
                ? fmt::format("rank {} closed its communicator; a collective needs every rank", left_ranks[0])
                : fmt::format("ranks {} closed their communicators; a collective needs every rank", fmt::join(left_ranks, ", "));
        record_failure(Status(ErrorCode::PeerUnreachable), why);
        throw PeerUnreachableError(fmt::format("rank {}: {}: {}", rank, call, why));
      }
    }
    ++seq;
    call_check = detail::CallCheck{};
    if (options.check_calls && size > 1) post_call(call, fp);
    if (agreement_enabled() && seq % static_cast<std::uint64_t>(options.health_agree_every) == 0) {
      // The agreement may fence or move the link the fingerprints travel on and re-plan who
      // checks whom: compare them first, over the plan they were posted on.
      settle_call(call);
      detail::Failure failure;
      if (!agree(failure).is_ok()) raise(fmt::format("fence agreement before {}", call).c_str(), failure);
      if (!options.health_prometheus.empty()) write_prometheus(snapshot_of(*this));
    }
  }

  // Runs a ring collective. `direct`: final values may go straight into the right neighbour's
  // output (allreduce, allgather, broadcast). Large calls are split across the lanes.
  void run_ring_call(const char* call, const detail::RingCall& c, const Reducer& reducer, bool direct = false) {
    if (device_active) return run_device_call(call, c, reducer);
    const int lanes = lanes_for(c, reducer.elem_size);
    const bool deferred = can_defer_check(c, lanes);  // false when there is none or it was judged (from is null)
    if (!deferred) settle_call(call);
    if (lanes <= 1) {
      detail::RingCall checked = c;
      if (deferred) checked.check = &call_check;
      detail::Failure failure;
      const Status s = detail::run_ring(engine, flags, left, right, checked, reducer,
                                        direct ? direct_write_for(*this, c, reducer.elem_size) : detail::DirectWrite{}, relay_duties, failure);
      judge_call(call);  // first: a disagreement explains a failure better than what it caused
      if (!s.is_ok()) raise(call, failure);
      return;
    }
    // Slice [lo, hi) of the call's elements (of every block, for blocked layouts) per lane, in
    // units of 64 bytes where the element size allows, so slices start on cache lines.
    const std::size_t total = c.count;
    const std::size_t unit = reducer.elem_size <= 64 && 64 % reducer.elem_size == 0 ? 64 / reducer.elem_size : 1;
    const std::size_t units = (total + unit - 1) / unit;
    const std::size_t es = reducer.elem_size;
    for (int l = 0; l < lanes; ++l) {
      const std::size_t lo = std::min(total, units * static_cast<std::size_t>(l) / static_cast<std::size_t>(lanes) * unit);
      const std::size_t hi = std::min(total, units * static_cast<std::size_t>(l + 1) / static_cast<std::size_t>(lanes) * unit);
      detail::RingCall part = c;
      part.count = hi - lo;
      part.send = c.send ? static_cast<const std::byte*>(c.send) + lo * es : nullptr;
      part.recv = c.recv ? static_cast<std::byte*>(c.recv) + lo * es : nullptr;
      if (c.kind == detail::RingCollective::ReduceScatter || c.kind == detail::RingCollective::Allgather)
        part.stride = c.stride ? c.stride : total;
      LaneJob& job = lane_jobs[static_cast<std::size_t>(l)];
      job.call = part;
      job.reducer = &reducer;
      job.direct = direct ? direct_write_for(lane(l), part, es) : detail::DirectWrite{};
      job.failure = detail::Failure{};
      job.status = Status::ok();
    }
    run_lanes(lanes);
    // The first failure that did not come from a sibling lane's local abort explains the call.
    const LaneJob* failed_job = nullptr;
    for (int l = 0; l < lanes; ++l) {
      const LaneJob& job = lane_jobs[static_cast<std::size_t>(l)];
      if (job.status.is_ok()) continue;
      const bool sibling = job.failure.aborted_by_peer && job.failure.peer == rank;
      if (!failed_job || (!sibling && failed_job->failure.aborted_by_peer && failed_job->failure.peer == rank)) failed_job = &job;
    }
    if (failed_job) raise(call, failed_job->failure);
  }

  LaneState& lane(int l) { return l == 0 ? static_cast<LaneState&>(*this) : *extra_lanes[static_cast<std::size_t>(l - 1)]; }

  // Lanes a ring collective of `c` uses: 1 unless several exist, the collective is one that
  // splits (ring allreduce, reduce-scatter, allgather, chain broadcast and reduce) and every lane
  // gets at least `channel_min_bytes`. The same on every rank (same call, same options).
  int lanes_for(const detail::RingCall& c, std::size_t elem_size) const noexcept {
    if (extra_lanes.empty()) return 1;
    switch (c.kind) {
      case detail::RingCollective::Allreduce:
      case detail::RingCollective::ReduceScatter:
      case detail::RingCollective::Allgather:
      case detail::RingCollective::Broadcast:
      case detail::RingCollective::Reduce: break;
      default: return 1;
    }
    const std::size_t bytes = c.count * elem_size;
    const std::size_t per = std::max<std::size_t>(options.channel_min_bytes, 1);
    return static_cast<int>(std::clamp<std::size_t>(bytes / per, 1, extra_lanes.size() + 1));
  }

  // Runs lane_jobs[0..lanes) at once: lane 0 on this thread, the others on their workers. A
  // lane that fails stops its siblings through their local abort words (bounded: every wait
  // checks it), so no lane outlives the call by more than one wait slice.
  void run_lanes(int lanes) {
    {
      std::lock_guard lock(lane_mutex);
      lanes_in_use = lanes;
      lanes_pending = lanes - 1;
      ++lane_round;
    }
    lane_cv.notify_all();
    run_lane_job(0);
    std::unique_lock lock(lane_mutex);
    lane_done_cv.wait(lock, [&] { return lanes_pending == 0; });
  }

  void run_lane_job(int l) noexcept {
    LaneState& L = lane(l);
    LaneJob& job = lane_jobs[static_cast<std::size_t>(l)];
    job.status = detail::run_ring(L.engine, L.flags, L.left, L.right, job.call, *job.reducer, job.direct, L.relay_duties, job.failure);
    if (!job.status.is_ok()) {
      const std::uint32_t value = detail::FlagBlock::abort_value(job.status.code(), rank, job.failure.peer);
      for (int o = 0; o < lanes_in_use; ++o)
        if (o != l) {
          std::atomic<std::uint32_t>& word = lane(o).flags.abort->value;
          std::uint32_t expected = 0;
          word.compare_exchange_strong(expected, value, std::memory_order_acq_rel);
        }
    }
  }

  void start_lane_workers() {
    lane_jobs.resize(extra_lanes.size() + 1);
    for (std::size_t i = 0; i < extra_lanes.size(); ++i)
      lane_threads.emplace_back([this, l = static_cast<int>(i + 1)] {
        std::uint64_t seen = 0;
        std::unique_lock lock(lane_mutex);
        for (;;) {
          lane_cv.wait(lock, [&] { return lane_stop || lane_round != seen; });
          if (lane_stop) return;
          seen = lane_round;
          if (l >= lanes_in_use) continue;
          lock.unlock();
          run_lane_job(l);
          lock.lock();
          if (--lanes_pending == 0) lane_done_cv.notify_all();
        }
      });
    if (!extra_lanes.empty())
      log.info("{} channels: ring collectives of at least {} bytes per channel are split across them", extra_lanes.size() + 1,
               options.channel_min_bytes);
  }

  void stop_lane_workers() noexcept {
    {
      std::lock_guard lock(lane_mutex);
      lane_stop = true;
    }
    lane_cv.notify_all();
    for (auto& t : lane_threads)
      if (t.joinable()) t.join();
    lane_threads.clear();
  }

  void run_group(const char* call) {
    if (group_ops.empty()) return;
    drain();  // queued asynchronous work runs first (issue order)
    apply_timeout(call_timeout);
    check_p2p_routes(call, group_ops);
    run_ops(call, group_ops, options.p2p_direct_user_min_bytes);
  }

  // Point-to-point has no third party to relay through: a transfer over a fenced link fails
  // everywhere alike, at once (`ops` is cleared).
  void check_p2p_routes(const char* call, std::vector<detail::P2POp>& ops) {
    for (const auto& op : ops)
      if (op.peer != rank && is_fenced(rank, op.peer)) {
        ops.clear();
        detail::Failure f{Status(ErrorCode::Fenced), op.peer,
                          "a route for point-to-point transfers over a fenced link (no fallback transport both ends "
                          "allow, RINGFENCE_FALLBACK, took the pair, and no third rank relays send/recv)",
                          0};
        raise(call, f);
      }
  }

  // Stream-ordered send/recv: queued like host ones (one stream per group), then run as one
  // staged call: every send buffer packed into staging on the stream, the host transfers on the
  // progress thread in issue order, every receive unpacked from staging on the stream.
  struct DeviceP2P {
    bool is_send = false;
    int peer = -1;
    void* buf = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<DeviceP2P> device_group_ops;  // queued by the stream-ordered send()/recv()
  void* device_group_stream = nullptr;      // their stream
  std::vector<detail::P2POp> device_p2p_run;  // the worker's copy of a running group (reused)

  void queue_device_p2p(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer,
                        CudaStream stream) {
    check_usable(call);
    check_type(call, type);
    check_peer(call, peer);
    const std::size_t bytes = bytes_of(call, "count", count, type);
    check_pointer(call, "buf", buf, bytes);
    RINGFENCE_EXPECTS(group_ops.empty(),
                      "rank {}: {} on a CUDA stream: this group already holds send/recv on host memory (without a stream); a "
                      "group takes one kind",
                      rank, call);
    RINGFENCE_EXPECTS(device_group_ops.empty() || device_group_stream == stream.handle,
                      "rank {}: {}: stream {} differs from stream {} of this group's earlier send/recv (a group of "
                      "stream-ordered send/recv takes one stream)",
                      rank, call, stream.handle, device_group_stream);
    if (bytes == 0) return;
    RINGFENCE_EXPECTS(peer != rank || group_depth > 0,
                      "rank {}: {}: a transfer to or from ourselves needs its match in the same group_start()/group_end()", rank, call);
    device_group_stream = stream.handle;
    device_group_ops.push_back(DeviceP2P{is_send, peer, const_cast<void*>(buf), bytes});
    if (group_depth == 0) run_device_group(call);
  }

  void run_device_group(const char* call) {
    std::vector<DeviceP2P> ops = std::move(device_group_ops);
    device_group_ops.clear();
    if (ops.empty()) return;
    // Send/recv involve only some ranks, so they never make the decision (use_device_lane); once
    // a collective made it, they follow it: on the device lane, on the user's buffers.
    if (device_verdict > 0) {
      for (const DeviceP2P& op : ops) check_device_pointer(call, "buf", op.buf, op.bytes);
      std::vector<detail::P2POp> direct;
      direct.reserve(ops.size());
      for (const DeviceP2P& op : ops) direct.push_back(detail::P2POp{op.is_send, op.peer, static_cast<std::byte*>(op.buf), op.bytes, 0});
      staged(call, CudaStream{device_group_stream}, {}, {}, [&](std::byte*, std::byte*) {
        return issue(true, call, [this, call, direct = std::move(direct)] {
          device_p2p_run.assign(direct.begin(), direct.end());
          check_p2p_routes(call, device_p2p_run);
          run_ops(call, device_p2p_run, options.p2p_direct_user_min_bytes);
        });
      }, true);
      return;
    }
    std::vector<detail::DeviceStager::Piece> ins, outs;
    std::vector<std::size_t> at(ops.size());  // offset of each op's bytes in staging in / out
    std::size_t in_total = 0, out_total = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      std::size_t& total = ops[i].is_send ? in_total : out_total;
      at[i] = total;
      total += ops[i].bytes;
      (ops[i].is_send ? ins : outs).push_back(detail::DeviceStager::Piece{ops[i].buf, ops[i].bytes});
    }
    staged(call, CudaStream{device_group_stream}, std::span<const detail::DeviceStager::Piece>(ins),
           std::span<const detail::DeviceStager::Piece>(outs), [&](std::byte* in, std::byte* out) {
             std::vector<detail::P2POp> host;
             host.reserve(ops.size());
             for (std::size_t i = 0; i < ops.size(); ++i)
               host.push_back(detail::P2POp{ops[i].is_send, ops[i].peer, (ops[i].is_send ? in : out) + at[i], ops[i].bytes, 0});
             return issue(true, call, [this, call, host = std::move(host)] {
               // run_ops consumes its list: a copy into storage the worker reuses
               device_p2p_run.assign(host.begin(), host.end());
               check_p2p_routes(call, device_p2p_run);
               run_ops(call, device_p2p_run, options.p2p_direct_user_min_bytes);
             });
           });
  }

  // `user_min_bytes`: from this size plain user receive buffers take direct writes (cross-memory
  // attach) instead of staging.
  // On the device lane during a device-lane call (no direct transfers: keys of user device
  // buffers are not exchanged).
  void run_ops(const char* call, std::vector<detail::P2POp>& ops, std::size_t user_min_bytes) {
    detail::Failure failure;
    if (device_active) enter_device(call);
    const Status s = device_active ? detail::run_p2p(device_lane->engine, device_lane->flags, device_channel_of.data(), ops.data(),
                                                     ops.size(), detail::P2PDirect{}, failure, &device_regions)
                                   : detail::run_p2p(engine, flags, channel_of.data(), ops.data(), ops.size(),
                                                     p2p_direct(user_min_bytes), failure);
    ops.clear();
    if (!s.is_ok()) raise(call, failure);
  }

  void queue_p2p(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer) {
    check_usable(call);
    check_type(call, type);
    check_peer(call, peer);
    const std::size_t bytes = bytes_of(call, "count", count, type);
    check_pointer(call, "buf", buf, bytes);
    if (bytes == 0) return;
    RINGFENCE_EXPECTS(peer != rank || group_depth > 0,
                      "rank {}: {}: a transfer to or from ourselves needs its match in the same group_start()/group_end()", rank, call);
    RINGFENCE_EXPECTS(device_group_ops.empty(),
                      "rank {}: {}: this group already holds send/recv on a CUDA stream; a group takes one kind", rank, call);
    group_ops.push_back(detail::P2POp{is_send, peer, static_cast<std::byte*>(const_cast<void*>(buf)), bytes, 0});
    if (group_depth == 0) run_group(call);
  }

  // An error class as the abort word carries it, in words for a message.
  static std::string class_of(ErrorCode code) {
    // Transient is what the engine's checksums and a transport's exhausted retries (ibverbs
    // retry-exceeded) both end in: say what it means without naming one cause.
    if (code == ErrorCode::Transient) return "transient: a link kept failing (checksums or retries exhausted)";
    return std::string(to_string(code));
  }

  [[noreturn]] void raise(const char* call, const detail::Failure& f) {
    if (f.aborted_by_peer && f.peer == rank) {
      // A local abort (abort(), or the heartbeat found a peer gone): the reason was recorded.
      Status s;
      std::string why;
      {
        std::lock_guard lock(status_mutex);
        s = failure;
        why = failure_message;
      }
      if (!s.is_ok()) {
        abort_peers(s.code(), f.blamed);  // ranks waiting on us learn it now (this thread drives the links)
        throw_status(s, fmt::format("rank {}: {} #{} failed: {}", rank, call, seq, why));
      }
    }
    if (!f.aborted_by_peer) {
      // A timeout while some rank's heartbeat is overdue most likely ends at that rank: blame
      // it, so the others name it too (not the neighbour that was itself waiting on it).
      std::int64_t age_ms = 0;
      const int silent = f.status.code() == ErrorCode::Timeout ? silent_peer(age_ms) : -1;
      abort_peers(f.status.code(), silent >= 0 ? silent : f.peer);
    }
    // The link: the one the executor failed on (it names its transport), else lane 0's to the peer.
    const std::string* transport = f.transport ? f.transport : f.peer >= 0 && f.peer != rank ? &channel_to(f.peer).transport_name : nullptr;
    const std::string link = transport ? fmt::format("{} link rank {} <-> rank {}", *transport, rank, f.peer) : "local";
    std::string why;
    if (f.aborted_by_peer) {
      why = f.status.code() == ErrorCode::Aborted
                ? fmt::format("rank {} aborted the communicator (abort())", f.peer)
            : f.blamed >= 0 ? fmt::format("rank {} failed ({}, blaming rank {}) and aborted the collective", f.peer,
                                          class_of(f.status.code()), f.blamed)
                            : fmt::format("rank {} failed ({}) and aborted the collective", f.peer, class_of(f.status.code()));
    } else switch (f.status.code()) {
      case ErrorCode::Timeout:
        why = fmt::format("timed out after {} ms waiting for {} from rank {}{}", engine.timeout / std::chrono::milliseconds(1), f.what,
                          f.peer, silent_peer_note());
        break;
      case ErrorCode::PeerUnreachable: why = fmt::format("rank {} is unreachable (process exited?) while waiting for {}", f.peer, f.what); break;
      case ErrorCode::Fenced: why = fmt::format("the link to rank {} is fenced ({})", f.peer, f.what); break;
      default:
        why = fmt::format("{} while {} (native code {})", to_string(f.status.code()), f.what, f.status.native());
        break;
    }
    const std::string message = fmt::format("rank {}: {} #{} failed: {} ({}, message {})", rank, call, seq, why, link, f.message);
    // A peer's abort() reaches us as an unreachable peer (our own abort() is AbortedError).
    const Status status = f.aborted_by_peer && f.status.code() == ErrorCode::Aborted ? Status(ErrorCode::PeerUnreachable) : f.status;
    record_failure(status, message);
    log.error("{}", message);
    throw_status(status, message);
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() {
  try {
    if (impl_ && !impl_->options.health_prometheus.empty()) impl_->write_prometheus(health());
  } catch (...) {  // a destructor never throws; the file is best effort
  }
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const TransportRegistry& registry,
                           CommOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->rank = rank;
  impl_->size = size;
  impl_->store = std::move(store);
  impl_->registry = registry;
  impl_->setup(registry);
}

Communicator Communicator::shrink(const std::vector<int>& exclude) { return shrink(exclude, live(__func__)->options); }

Communicator Communicator::shrink(const std::vector<int>& exclude, CommOptions options) {
  Impl& m = *live(__func__);
  std::vector<int> gone = exclude;
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  for (int r : gone)
    RINGFENCE_EXPECTS(r >= 0 && r < m.size, "rank {}: shrink: excluded rank {} is out of range [0, {})", m.rank, r, m.size);
  RINGFENCE_EXPECTS(!std::binary_search(gone.begin(), gone.end(), m.rank),
                    "rank {}: shrink: this rank is in the exclude list (excluded ranks must not call shrink)", m.rank);
  const int new_size = m.size - static_cast<int>(gone.size());
  auto new_rank_of = [&](int r) {  // survivors keep their order
    return r - static_cast<int>(std::lower_bound(gone.begin(), gone.end(), r) - gone.begin());
  };
  m.drain();  // queued work first (it fails fast when the communicator is broken)
  // A fresh namespace in the store: the shrink count (equal on every survivor: same calls in
  // the same order) and the excluded ranks.
  const std::string prefix = fmt::format("shrink/{}/{}/", m.shrinks++, fmt::join(gone, ","));
  Communicator next(std::make_shared<PrefixStore>(m.store, prefix), new_rank_of(m.rank), new_size, m.registry, std::move(options));
  next.impl_->server = m.server;
  // Fences between survivors stay: the same agreed list on every survivor gives the same plan.
  std::vector<LinkId> carried;
  for (const LinkId& l : m.fenced)
    if (!std::binary_search(gone.begin(), gone.end(), l.a) && !std::binary_search(gone.begin(), gone.end(), l.b))
      carried.push_back(LinkId::of(new_rank_of(l.a), new_rank_of(l.b)));
  if (!carried.empty()) next.impl_->install_fences(std::move(carried));
  m.log.warn("shrunk to {} ranks without rank(s) {}: this rank is now rank {}", new_size, fmt::join(gone, ","), next.rank());
  return next;
}

std::optional<Communicator> Communicator::split(int color, int key) { return split(color, key, live(__func__)->options); }

std::optional<Communicator> Communicator::split(int color, int key, CommOptions options) {
  Impl& m = *live(__func__);
  // Everyone's (color, key): one allgather, so every rank derives the same groups.
  const std::int32_t mine[2] = {color < 0 ? -1 : color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(m.size));
  allgather(mine, all.data(), 2, DataType::Int32);
  const std::uint64_t number = m.splits++;
  if (color < 0) return std::nullopt;
  std::vector<int> members;  // old ranks of our group, in new rank order
  for (int r = 0; r < m.size; ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
  });
  const auto new_rank_of = [&](int r) {
    return static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
  };
  const std::string prefix = fmt::format("split/{}/{}/", number, color);
  Communicator next(std::make_shared<PrefixStore>(m.store, prefix), new_rank_of(m.rank), static_cast<int>(members.size()),
                    m.registry, std::move(options));
  next.impl_->server = m.server;
  std::vector<LinkId> carried;  // fences between two members stay
  for (const LinkId& l : m.fenced)
    if (new_rank_of(l.a) < static_cast<int>(members.size()) && new_rank_of(l.b) < static_cast<int>(members.size()))
      carried.push_back(LinkId::of(new_rank_of(l.a), new_rank_of(l.b)));
  if (!carried.empty()) next.impl_->install_fences(std::move(carried));
  return next;
}

Communicator Communicator::from_launch(const LaunchInfo& launch, const TransportRegistry& registry, CommOptions options) {
  std::shared_ptr<TcpStoreServer> server;
  if (launch.host_store) {
    const Logger log(options.log_level, launch.rank);
    try {
      server = std::make_shared<TcpStoreServer>(launch.token, "0.0.0.0", launch.store_port, TcpStoreServerOptions{}, &log);
    } catch (const SystemError& e) {
      if (e.native() != EADDRINUSE) throw;
      // The port came from the launcher's variables (MASTER_PORT+1 under torchrun, a hash of the
      // job id under mpirun / srun): say how to pick another one.
      throw SystemError(fmt::format("rank {}: cannot host the bootstrap store: {} (launcher {}: set "
                                    "RINGFENCE_STORE_ADDR=host:port to a free port on rank 0's host)",
                                    launch.rank, e.what(), to_string(launch.launcher)),
                        e.native());
    }
  }
  auto store = std::make_shared<TcpStoreClient>(launch.store_host, launch.store_port, launch.token, options.timeout);
  Communicator comm(std::move(store), launch.rank, launch.size, registry, std::move(options));
  comm.impl_->server = std::move(server);
  return comm;
}

Communicator::Impl* Communicator::live(const char* call) const {
  if (!impl_)
    throw InvalidUsage(fmt::format("{}: this communicator was moved from: it has no ranks or links any more (use the one it was "
                                   "moved into)",
                                   call));
  return impl_.get();
}

int Communicator::rank() const noexcept { return impl_ ? impl_->rank : -1; }
int Communicator::size() const noexcept { return impl_ ? impl_->size : 0; }
const CommOptions& Communicator::options() const noexcept {
  static const CommOptions kDefaults;  // immutable: what a moved-from communicator reports
  return impl_ ? impl_->options : kDefaults;
}
std::uint64_t Communicator::sequence() const noexcept { return impl_ ? impl_->seq : 0; }

void Communicator::abort() noexcept {
  if (!impl_) return;
  Impl& m = *impl_;
  try {
    if (m.record_failure(Status(ErrorCode::Aborted), fmt::format("rank {} aborted the communicator (abort())", m.rank)))
      m.log.warn("communicator aborted (abort()): in-flight and later calls fail");
  } catch (...) {  // formatting or logging failed: the abort itself goes on
    m.record_failure(Status(ErrorCode::Aborted), std::string());
  }
  m.local_abort(ErrorCode::Aborted, -1);
  {
    std::lock_guard lock(m.beat_mutex);
    m.abort_requested = true;
  }
  m.beat_cv.notify_all();
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  RINGFENCE_EXPECTS(timeout.count() >= 0, "rank {}: set_timeout: timeout {} ms is negative", live(__func__)->rank, timeout.count());
  live(__func__)->call_timeout = timeout;
}

Status Communicator::async_error() const noexcept {
  if (!impl_) return Status(ErrorCode::InvalidUsage);
  std::lock_guard lock(impl_->status_mutex);
  return impl_->failure;
}

// ---- collectives: checks on the caller's thread, then run now or queue (async) ----

Work Communicator::Impl::allreduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                   detail::CallKind kind) {
  const char* call = kind == detail::CallKind::Barrier ? "barrier" : "allreduce";
  check_usable(call);
  const std::size_t bytes = check_allreduce(call, send, recv, count, type, op).in;
  return issue(async, call, [this, call, send, recv, count, bytes, type, op, kind] {
    const Reducer reducer = host_reducer(type, op);
    begin_collective(call, fingerprint(kind, count, type, static_cast<int>(op)));
    const TunerModel& model = tuner_model;
    // The same choice on the device lane (every rank is on it or none is); its links reach every
    // peer directly, as the tree, direct and one-shot schedules need.
    Algorithm algo = choose_allreduce(model, options.algorithm, size, bytes, tree_allowed, fenced.empty());
    // One-shot sends the input to every peer before any result lands, so in place it works on a
    // copy of the input: at most one slot (the same limit on every rank, whatever its buffers).
    // On the device lane run_device_call makes the copy, in device memory.
    if (algo == Algorithm::OneShot && bytes > oneshot_copy.size()) algo = Algorithm::Ring;
    const void* src = send;
    if (algo == Algorithm::OneShot && send == recv && bytes > 0 && !device_active) {
      std::memcpy(oneshot_copy.data(), send, bytes);
      src = oneshot_copy.data();
    }
    if (algo != Algorithm::Ring) {
      const auto kind = algo == Algorithm::Tree     ? detail::RingCollective::TreeAllreduce
                        : algo == Algorithm::Direct ? detail::RingCollective::DirectAllreduce
                                                    : detail::RingCollective::OneShotAllreduce;
      detail::RingCall c{kind, src, recv, count, 0};
      c.by_position = position_channel.data();
      c.by_rank = channel_of.data();
      run_ring_call(call, c, reducer);
    } else {
      run_ring_allreduce_call(call, send, recv, count, bytes, reducer);
    }
    if (size > 1 && options.digest_every > 0 && seq % static_cast<std::uint64_t>(options.digest_every) == 0 && !device_active) {
      detail::Failure failure;
      if (!compare_digests(recv, bytes, failure).is_ok()) raise("result digest comparison after allreduce", failure);
    }
  });
}

detail::DirectWrite Communicator::Impl::direct_write_for(LaneState& lane, const detail::RingCall& c, std::size_t elem_size) {
  // The output this call writes: one range, or (allgather) `size` blocks `stride` apart.
  void* recv = c.recv;
  const std::size_t blocks = c.kind == detail::RingCollective::Allgather ? static_cast<std::size_t>(size) : 1;
  const std::size_t bytes = ((blocks - 1) * (c.stride ? c.stride : c.count) + c.count) * elem_size;
  detail::DirectWrite direct;
  // With checksums every chunk goes through staging: a corrupted chunk must land where it can
  // be verified and replaced, not in the output.
  if (size > 1 && bytes >= options.direct_write_min_bytes && !engine.checksum) {
    // Every rank takes part in the key exchange (same decision everywhere: same size and
    // options); each decides for its own output whether the left neighbour writes into it.
    direct.enabled = true;
    direct.call = static_cast<std::uint32_t>(seq);
    if (is_allocated(recv, bytes) || bytes >= options.direct_write_user_min_bytes || lane.left->transport->cheap_user_writes())
      direct.own_key = output_key(recv, bytes, lane.left->transport);
    direct.resolve = &Impl::resolve_remote;
    direct.ctx = this;
  }
  return direct;
}

void Communicator::Impl::run_ring_allreduce_call(const char* call, const void* send, void* recv, std::size_t count,
                                                 std::size_t bytes, const Reducer& reducer) {
  (void)bytes;
  run_ring_call(call, detail::RingCall{detail::RingCollective::Allreduce, send, recv, count, 0}, reducer, true);
}

Work Communicator::Impl::reduce_scatter(bool async, const void* send, void* recv, std::size_t recvcount, DataType type,
                                        ReduceOp op) {
  const char* call = "reduce_scatter";
  check_usable(call);
  check_reduce_scatter(call, send, recv, recvcount, type, op);
  return issue(async, call, [=, this] {
    begin_collective(call, fingerprint(detail::CallKind::ReduceScatter, recvcount, type, static_cast<int>(op)));
    detail::RingCall c{detail::RingCollective::ReduceScatter, send, recv, recvcount, 0};
    c.blocks = ring.data();  // block = rank, whatever the ring's order
    run_ring_call(call, c, host_reducer(type, op));
  });
}

Work Communicator::Impl::allgather(bool async, const void* send, void* recv, std::size_t sendcount, DataType type) {
  const char* call = "allgather";
  check_usable(call);
  const std::size_t send_bytes = check_allgather(call, send, recv, sendcount, type).in;
  return issue(async, call, [=, this] {
    begin_collective(call, fingerprint(detail::CallKind::Allgather, sendcount, type));
    // Moves bytes only: chunking in bytes keeps the schedule independent of the type.
    detail::RingCall c{detail::RingCollective::Allgather, send, recv, send_bytes, 0};
    c.blocks = ring.data();  // block = rank, whatever the ring's order
    run_ring_call(call, c, host_reducer(DataType::Uint8, ReduceOp::Sum), true);
  });
}

Work Communicator::Impl::broadcast(bool async, const void* send, void* recv, std::size_t count, DataType type, int root) {
  const char* call = "broadcast";
  check_usable(call);
  const std::size_t bytes = check_broadcast(call, send, recv, count, type, root).out;
  return issue(async, call, [=, this] {
    begin_collective(call, fingerprint(detail::CallKind::Broadcast, count, type, -1, root));
    run_ring_call(call, detail::RingCall{detail::RingCollective::Broadcast, send, recv, bytes, position_of(root)},
                  host_reducer(DataType::Uint8, ReduceOp::Sum), true);
  });
}

Work Communicator::Impl::reduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  const char* call = "reduce";
  check_usable(call);
  check_reduce(call, send, recv, count, type, op, root);
  return issue(async, call, [=, this] {
    begin_collective(call, fingerprint(detail::CallKind::Reduce, count, type, static_cast<int>(op), root));
    run_ring_call(call, detail::RingCall{detail::RingCollective::Reduce, send, recv, count, position_of(root)},
                  host_reducer(type, op));
  });
}

Work Communicator::Impl::alltoall(bool async, const void* send, void* recv, std::size_t count, DataType type) {
  const char* call = "alltoall";
  check_usable(call);
  const std::size_t bytes = check_alltoall(call, send, recv, count, type).in;
  const std::size_t block = bytes / static_cast<std::size_t>(size);
  return issue(async, call, [=, this] {
    begin_collective(call, fingerprint(detail::CallKind::Alltoall, count, type));
    settle_call(call);  // point-to-point transfers receive from every rank
    if (block == 0) return;
    // A group of sends and receives: every pair exchanges its blocks side by side. The op list
    // is this call's own (group_ops belongs to the user's thread).
    auto* in = static_cast<std::byte*>(const_cast<void*>(send));
    auto* out = static_cast<std::byte*>(recv);
    auto block_of = [&](std::byte* base, int r) { return base + static_cast<std::size_t>(r) * block; };
    auto& ops = alltoall_ops;
    ops.clear();
    // The device lane has its own link to every rank (a fenced pair's moved to its fallback
    // where there is one, see move_device_links): no relay through host buffers there.
    const bool relayed = !fenced.empty() && !device_active;
    for (int k = 0; k < size; ++k) {
      const int to = (rank + k) % size, from = (rank - k + size) % size;
      if (!relayed || !is_fenced(rank, to)) ops.push_back(detail::P2POp{true, to, block_of(in, to), block, 0});
      if (!relayed || !is_fenced(rank, from)) ops.push_back(detail::P2POp{false, from, block_of(out, from), block, 0});
    }
    // Every pair exchanges at once: with staging each receiver must be scheduled for every
    // chunk of every peer, which costs wake-ups on a busy host; direct writes need only the
    // sender (measured: 4 ranks on 2 cores, 1 MiB blocks, 1.40 vs 0.26 GB/s busbw).
    const std::size_t user_min =
        size >= 3 ? std::min(options.p2p_direct_user_min_bytes, options.alltoall_direct_user_min_bytes) : options.p2p_direct_user_min_bytes;
    if (!relayed) return run_ops(call, ops, user_min);
    // Fenced pairs (a, b): every rank takes part, so a third rank c with healthy links to both
    // carries their blocks in two phases (a, b -> c, then c -> b, a). Every rank derives the
    // same relays from the agreed fence list, and ops to one peer keep the same order at both
    // ends (own block first, then relayed ones in fence order).
    alltoall_relay.resize(2 * fenced.size() * block);
    std::vector<int> via(fenced.size());
    for (std::size_t i = 0; i < fenced.size(); ++i) {
      const LinkId l = fenced[i];
      via[i] = -1;
      for (int c = 0; c < size && via[i] < 0; ++c)
        if (c != l.a && c != l.b && !is_fenced(c, l.a) && !is_fenced(c, l.b)) via[i] = c;
      if (via[i] < 0) {
        detail::Failure f{Status(ErrorCode::Fenced), rank == l.a ? l.b : l.a, "a rank to relay alltoall blocks around the fenced link", 0};
        raise(call, f);
      }
      std::byte* tmp = alltoall_relay.data() + 2 * i * block;
      if (rank == l.a) ops.push_back(detail::P2POp{true, via[i], block_of(in, l.b), block, 0});
      if (rank == l.b) ops.push_back(detail::P2POp{true, via[i], block_of(in, l.a), block, 0});
      if (rank == via[i]) {
        ops.push_back(detail::P2POp{false, l.a, tmp, block, 0});          // a's block for b
        ops.push_back(detail::P2POp{false, l.b, tmp + block, block, 0});  // b's block for a
      }
    }
    run_ops(call, ops, user_min);
    for (std::size_t i = 0; i < fenced.size(); ++i) {
      const LinkId l = fenced[i];
      std::byte* tmp = alltoall_relay.data() + 2 * i * block;
      if (rank == via[i]) {
        ops.push_back(detail::P2POp{true, l.b, tmp, block, 0});
        ops.push_back(detail::P2POp{true, l.a, tmp + block, block, 0});
      }
      if (rank == l.a) ops.push_back(detail::P2POp{false, via[i], block_of(out, l.b), block, 0});
      if (rank == l.b) ops.push_back(detail::P2POp{false, via[i], block_of(out, l.a), block, 0});
    }
    run_ops(call, ops, user_min);
  });
}

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  live(__func__)->allreduce(false, send, recv, count, type, op);
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op) {
  live(__func__)->reduce_scatter(false, send, recv, recvcount, type, op);
}
void Communicator::allgather(const void* send, void* recv, std::size_t sendcount, DataType type) {
  live(__func__)->allgather(false, send, recv, sendcount, type);
}
void Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root) {
  live(__func__)->broadcast(false, send, recv, count, type, root);
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  live(__func__)->reduce(false, send, recv, count, type, op, root);
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  live(__func__)->alltoall(false, send, recv, count, type);
}

// Stream-ordered calls: the host calls' argument checks on the user's buffers, then
// Impl::stream_ordered: the host collective on the user's buffers over the device lane, or on
// staging memory.
void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_allreduce("allreduce", send, recv, count, type, op);
  m->stream_ordered("allreduce", stream, send, io, recv,
                    [&](const void* in, void* out) { return m->allreduce(true, in, out, count, type, op); });
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op,
                                  CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_reduce_scatter("reduce_scatter", send, recv, recvcount, type, op);
  m->stream_ordered("reduce_scatter", stream, send, io, recv,
                    [&](const void* in, void* out) { return m->reduce_scatter(true, in, out, recvcount, type, op); });
}
void Communicator::allgather(const void* send, void* recv, std::size_t sendcount, DataType type, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_allgather("allgather", send, recv, sendcount, type);
  m->stream_ordered("allgather", stream, send, io, recv,
                    [&](const void* in, void* out) { return m->allgather(true, in, out, sendcount, type); });
}
void Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_broadcast("broadcast", send, recv, count, type, root);  // non-roots stage no input
  m->stream_ordered("broadcast", stream, send, io, recv,
                    [&](const void* in, void* out) { return m->broadcast(true, in, out, count, type, root); });
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                          CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_reduce("reduce", send, recv, count, type, op, root);  // non-roots copy no result back
  m->stream_ordered("reduce", stream, send, io, recv, [&](const void* in, void* out) {
    return m->reduce(true, in, io.out > 0 ? out : nullptr, count, type, op, root);
  });
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->check_alltoall("alltoall", send, recv, count, type);
  m->stream_ordered("alltoall", stream, send, io, recv,
                    [&](const void* in, void* out) { return m->alltoall(true, in, out, count, type); });
}
std::size_t Communicator::device_staging_bytes() const {
  const Impl* m = live(__func__);
  return m->stager ? m->stager->staging_bytes() : 0;
}
std::string Communicator::device_path() const {
  const Impl* m = live(__func__);
  return m->device_verdict > 0 ? std::string("device regions") : m->device_verdict < 0 ? "host-staged: " + m->device_why_not : std::string();
}
Work Communicator::allreduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  return live(__func__)->allreduce(true, send, recv, count, type, op);
}
Work Communicator::reduce_scatter_async(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op) {
  return live(__func__)->reduce_scatter(true, send, recv, recvcount, type, op);
}
Work Communicator::allgather_async(const void* send, void* recv, std::size_t sendcount, DataType type) {
  return live(__func__)->allgather(true, send, recv, sendcount, type);
}
Work Communicator::broadcast_async(const void* send, void* recv, std::size_t count, DataType type, int root) {
  return live(__func__)->broadcast(true, send, recv, count, type, root);
}
Work Communicator::reduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  return live(__func__)->reduce(true, send, recv, count, type, op, root);
}
Work Communicator::alltoall_async(const void* send, void* recv, std::size_t count, DataType type) {
  return live(__func__)->alltoall(true, send, recv, count, type);
}
Work Communicator::barrier_async() {
  // A one-element allreduce (see barrier()) on a token the communicator owns: queued barriers
  // run one after another on it, and it outlives them all.
  return live(__func__)->allreduce(true, &live(__func__)->barrier_token, &live(__func__)->barrier_token, 1, DataType::Uint8, ReduceOp::Max,
                          detail::CallKind::Barrier);
}
void Communicator::synchronize() { live(__func__)->drain(); }

void Communicator::send(const void* buf, std::size_t count, DataType type, int peer) {
  live(__func__)->queue_p2p("send", true, buf, count, type, peer);
}

void Communicator::recv(void* buf, std::size_t count, DataType type, int peer) {
  live(__func__)->queue_p2p("recv", false, buf, count, type, peer);
}

void Communicator::send(const void* buf, std::size_t count, DataType type, int peer, CudaStream stream) {
  live(__func__)->queue_device_p2p("send", true, buf, count, type, peer, stream);
}

void Communicator::recv(void* buf, std::size_t count, DataType type, int peer, CudaStream stream) {
  live(__func__)->queue_device_p2p("recv", false, buf, count, type, peer, stream);
}

void Communicator::group_start() {
  live(__func__)->check_usable("group_start");
  ++live(__func__)->group_depth;
}

void Communicator::group_end() {
  Impl& m = *live(__func__);
  RINGFENCE_EXPECTS(m.group_depth > 0, "rank {}: group_end: no matching group_start()", m.rank);
  if (--m.group_depth > 0) return;
  m.check_usable("group_end");
  if (!m.device_group_ops.empty()) {
    m.run_device_group("group_end");
  } else {
    m.run_group("group_end");
  }
}

void Communicator::barrier() {
  std::uint8_t token = 0;
  // A one-element allreduce: every rank's result depends on every rank's input, so nobody
  // leaves before everybody arrived.
  live(__func__)->allreduce(false, &token, &token, 1, DataType::Uint8, ReduceOp::Max, detail::CallKind::Barrier);
}

void* Communicator::alloc(std::size_t bytes, MemoryKind kind) {
  RINGFENCE_EXPECTS(kind == MemoryKind::Host, "rank {}: alloc: {} memory is not supported by this build", live(__func__)->rank, to_string(kind));
  RINGFENCE_EXPECTS(bytes > 0, "rank {}: alloc: bytes must be positive", live(__func__)->rank);
  void* p = live(__func__)->allocate(bytes);
  live(__func__)->user_allocs.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

void Communicator::free(void* ptr) {
  if (!ptr) return;
  Impl& m = *live(__func__);
  // Only what alloc() returned to the user (not internal memory, not another communicator's).
  const auto user = std::find_if(m.user_allocs.begin(), m.user_allocs.end(),
                                 [&](auto& r) { return r.first == reinterpret_cast<std::uintptr_t>(ptr); });
  auto& a = m.allocations;
  const auto it = std::find_if(a.begin(), a.end(), [&](auto& e) { return e.first == ptr; });
  RINGFENCE_EXPECTS(user != m.user_allocs.end() && it != a.end(),
                    "rank {}: free: pointer {} was not returned by this communicator's alloc() (freed twice, or another "
                    "communicator's?)",
                    m.rank, ptr);
  m.local_regs.clear();  // cached keys may describe the memory being freed
  m.user_allocs.erase(user);
  Impl::release(it->first, it->second);
  a.erase(it);
}

std::vector<LinkInfo> Communicator::links() const { return links_of(*live(__func__)); }

std::vector<LinkInfo> links_of(const Communicator::Impl& m) {
  std::vector<LinkInfo> out;
  std::lock_guard lock(m.links_mutex);  // a move may be replacing a link (reconnect)
  // A link's entry: its peer, transport and state, then `add` sums its counters (and, for the
  // host lanes, the other lanes' links to the same peer).
  auto entry = [&](const detail::Channel& ch, bool device_lane) {
    LinkInfo info;
    info.rank = m.rank;
    info.peer = ch.peer;
    info.transport = ch.transport_name;
    info.device_lane = device_lane;
    if (ch.link) info.state = ch.link->state();
    return info;
  };
  auto add = [](LinkInfo& info, const detail::Channel& c) {
    if (!c.link) return;
    const LinkStats& s = c.link->stats();
    info.channels_used += s.bytes_written.load(std::memory_order_relaxed) > 0;
    info.bytes_written += s.bytes_written.load(std::memory_order_relaxed);
    info.writes += s.writes.load(std::memory_order_relaxed);
    info.signals += s.signals.load(std::memory_order_relaxed);
    info.errors += s.errors.load(std::memory_order_relaxed);
    info.retries += s.retries.load(std::memory_order_relaxed) + c.resends.load(std::memory_order_relaxed);
    info.checksum_errors += c.checksum_errors.load(std::memory_order_relaxed);
    info.wait_ms += static_cast<double>(s.wait_ns.load(std::memory_order_relaxed)) / 1e6;
  };
  for (const auto& ch : m.channels) {
    LinkInfo info = entry(*ch, false);
    add(info, *ch);
    for (const auto& lane : m.extra_lanes)
      for (const auto& c : lane->channels)
        if (c->peer == ch->peer) add(info, *c);
    out.push_back(std::move(info));
  }
  if (const LaneState* d = m.device_lane_view.load(std::memory_order_acquire))
    for (const auto& ch : d->channels) {
      LinkInfo info = entry(*ch, true);
      add(info, *ch);
      out.push_back(std::move(info));
    }
  return out;
}

std::vector<int> Communicator::ring() const { return live(__func__)->ring.empty() ? std::vector<int>{0} : live(__func__)->ring; }
std::vector<LinkId> Communicator::fenced_links() const { return live(__func__)->fenced; }
std::vector<Relay> Communicator::relays() const { return live(__func__)->relays; }
std::uint64_t Communicator::epoch() const noexcept { return impl_ ? impl_->epoch : 0; }
std::uint64_t Communicator::digest_mismatches() const noexcept { return impl_ ? impl_->digest_mismatch_count : 0; }

HealthSnapshot Communicator::health() const { return snapshot_of(*live(__func__)); }

HealthSnapshot snapshot_of(const Communicator::Impl& m) {
  HealthSnapshot h;
  h.rank = m.rank;
  h.sequence = m.seq;
  h.epoch = m.epoch;
  h.ring = m.ring.empty() ? std::vector<int>{0} : m.ring;
  h.fenced = m.fenced;
  h.relays = m.relays;
  h.background_samples = m.monitor ? m.monitor->background_samples() : 0;
  h.links = links_of(m);
  return h;
}

void Communicator::on_health_event(EventCallback callback) { live(__func__)->event_callback = std::move(callback); }

std::string HealthSnapshot::table() const {
  const std::string fences = to_string(fenced), via = to_string(relays);
  return fmt::format("rank {}: collectives {}, epoch {}, ring {}, fenced links: {}, relays: {}\n{}", rank, sequence, epoch,
                     fmt::join(ring, "-"), fences.empty() ? "none" : fences, via.empty() ? "none" : via,
                     format_link_table(links));
}

std::string HealthSnapshot::prometheus() const {
  std::string out;
  auto metric = [&](std::string_view name, std::string_view help, std::string_view type) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // The device lane's links carry one more label, lane="device" (the host lanes' have none).
  auto lane = [](const LinkInfo& l) { return l.device_lane ? std::string_view(",lane=\"device\"") : std::string_view(); };
  metric("ringfence_link_state", "link state: 0 connecting, 1 up, 2 degraded, 3 fenced, 4 closed", "gauge");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_state{{rank=\"{}\",peer=\"{}\",transport=\"{}\"{}}} {}\n", l.rank, l.peer, l.transport,
                       lane(l), static_cast<int>(l.state));
  metric("ringfence_link_bytes_total", "payload bytes written to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_bytes_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l), l.bytes_written);
  metric("ringfence_link_checksum_errors_total", "corrupted chunks received from the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_checksum_errors_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l),
                       l.checksum_errors);
  metric("ringfence_link_resends_total", "chunks re-sent to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_resends_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l), l.retries);
  metric("ringfence_collectives_total", "collectives issued", "counter");
  out += fmt::format("ringfence_collectives_total{{rank=\"{}\"}} {}\n", rank, sequence);
  metric("ringfence_epoch", "plan epoch (re-plans so far)", "gauge");
  out += fmt::format("ringfence_epoch{{rank=\"{}\"}} {}\n", rank, epoch);
  metric("ringfence_fenced_links", "links fenced by agreement", "gauge");
  out += fmt::format("ringfence_fenced_links{{rank=\"{}\"}} {}\n", rank, fenced.size());
  metric("ringfence_relays", "fenced ring hops carried through a third rank", "gauge");
  out += fmt::format("ringfence_relays{{rank=\"{}\"}} {}\n", rank, relays.size());
  return out;
}

std::string Communicator::link_table() const { return format_link_table(links()); }

std::string format_link_table(const std::vector<LinkInfo>& links) {
  std::string out = fmt::format("{:>5} {:>5} {:>9} {:>10} {:>14} {:>10} {:>10} {:>7} {:>9} {:>8} {:>10}\n", "rank", "peer",
                                "transport", "state", "bytes", "writes", "signals", "errors", "crc-errs", "resends",
                                "wait(ms)");
  for (const auto& l : links)
    out += fmt::format("{:>5} {:>5} {:>9} {:>10} {:>14} {:>10} {:>10} {:>7} {:>9} {:>8} {:>10.1f}{}\n", l.rank, l.peer,
                       l.transport, to_string(l.state), l.bytes_written, l.writes, l.signals, l.errors, l.checksum_errors,
                       l.retries, l.wait_ms, l.device_lane ? "  device lane" : "");
  return out;
}

}  // namespace ringfence
