#include "lanes.hpp"


#include <algorithm>
#include <cstring>
#include <ringfence/communicator.hpp>
#include <ringfence/error.hpp>

#include "../health/reporting.hpp"
#include "failure.hpp"

namespace ringfence::detail {

namespace {

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

constexpr int kMaxAutoLanes = 4;
constexpr int kNetworkMinLanes = 2;

}  // namespace

std::size_t Lanes::choose_transports() {
  for (int p = 0; p < ctx_.size; ++p)
    if (p != ctx_.rank) lane0_.connection_to(p);
  connection_of_.assign(static_cast<std::size_t>(ctx_.size), nullptr);
  for (auto& ch : lane0_.connections) connection_of_[static_cast<std::size_t>(ch->peer)] = ch.get();
  std::size_t min_chunk = 0;
  for (auto& ch : lane0_.connections) {
    std::string reasons;
    for (const auto& t : ctx_.transports) {
      const Reachability r = t->can_reach(ctx_.self, ctx_.peer(ch->peer));
      if (r.ok) {
        ch->transport = t.get();
        ch->expected_gbps = r.bandwidth_gbps;
        min_chunk = std::max(min_chunk, r.min_chunk_bytes);
        ch->transport_name = std::string(t->name());
        break;
      }
      reasons += fmt::format(" {}: {};", t->name(), r.reason);
    }
    if (!ch->transport)
      throw Error(ErrorCode::PeerUnreachable, fmt::format("rank {}: no transport reaches rank {}:{}", ctx_.rank, ch->peer, reasons));
  }
  return min_chunk;
}

bool Lanes::has_network_link() const noexcept {
  for (const auto& ch : lane0_.connections)
    if (ch->transport && !ch->transport->traits().shares_memory) return true;
  return false;
}

// Every rank computes the same number only if hosts look alike, so the result is checked in the
// protocol fingerprint.
int Lanes::lane_count() const {
  if (ctx_.options.channels > 0) return ctx_.options.channels;
  const int local = ctx_.ranks_on_host();
  const int cpus = online_cpus();
  // Every link a network link: at least two lanes unless the host is oversubscribed. A tcp
  // lane's thread blocks in sends and socket reads, and a second lane overlaps them; 2 tcp
  // ranks on the 2-core VM gain 1.16-1.20x median busbw from 16 MiB (docs/tuning.md "Channels").
  const int least = ctx_.network_only() && local <= cpus ? kNetworkMinLanes : 1;
  return std::clamp(std::max(cpus / local, least), 1, kMaxAutoLanes);
}

void Lanes::follow_lane0(LaneState& L, bool expected) const {
  for (const auto& ch : lane0_.connections) {
    Connection& mine = L.connection_to(ch->peer);
    mine.transport = ch->transport;
    mine.transport_name = ch->transport_name;
    if (expected) mine.expected_gbps = ch->expected_gbps;
  }
}

void Lanes::finish_connect(PendingLink& pending, Connection& ch, std::chrono::steady_clock::time_point deadline,
                           const std::string& what) {
  for (std::unique_ptr<Link> link;;) {
    const Status s = pending.try_finish(link);
    if (s.is_ok()) {
      std::lock_guard lock(links_mutex_);  // a move's new link: links() may be reading
      ch.link = std::move(link);
      return;
    }
    if (s.is_error()) throw_status(s, what + " failed");
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(fmt::format("{} timed out after {} ms", what, ctx_.options.timeout.count()));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Store keys of lane 0 have no suffix, lane c's end in "/lane<c>".
void Lanes::connect(LaneState& L, int index, MemoryKind memory, std::byte** extra_slot) {
  const int rank = ctx_.rank, size = ctx_.size;
  const std::string suffix = index == 0            ? std::string()
                             : index == kBeatLane   ? std::string("/beat")
                             : index == kDeviceLane ? std::string("/device")
                                                    : fmt::format("/lane{}", index);
  L.flags_mem = allocate(FlagBlock::bytes(size));
  L.flags.bind(L.flags_mem, size);
  for (auto& ch : L.connections)  // our posts' copies, laid out as the peer's slots for them
    if (ch->posts.stride() != call_slot_bytes(size)) ch->posts = KeptPosts(size);
  // Another lane's engine starts as a copy of lane 0's: its re-send requests come through its
  // own flags, never through lane 0's retained chunks.
  L.engine.retained_peers = nullptr;
  const std::size_t inbox_bytes = L.engine.slot_stride() * static_cast<std::size_t>(L.engine.slots);
  const std::size_t scratch_bytes = L.engine.slot_bytes * static_cast<std::size_t>(L.engine.slots + 1);
  if (memory == MemoryKind::Host) {
    L.inbox_mem = allocate(inbox_bytes * L.connections.size());
    for (std::size_t i = 0; i < L.connections.size(); ++i) L.connections[i]->inbox = static_cast<std::byte*>(L.inbox_mem) + i * inbox_bytes;
    L.scratch_mem = allocate(scratch_bytes);
    if (index == 0) {  // point-to-point runs on lane 0 (Connection::retained)
      const std::size_t retained_bytes = L.engine.slot_bytes * static_cast<std::size_t>(L.engine.slots);
      L.retained_mem = allocate(retained_bytes * L.connections.size());
      std::memset(L.retained_mem, 0, retained_bytes * L.connections.size());  // fault the pages in now, not in a call
      for (std::size_t i = 0; i < L.connections.size(); ++i)
        L.connections[i]->retained = static_cast<std::byte*>(L.retained_mem) + i * retained_bytes;
      L.engine.retained_peers = connection_of_.data();
    }
  } else {
    for (auto& ch : L.connections) ch->inbox = allocate_device(*ch->transport, inbox_bytes);
    // One slot more than the scratch: the input copy of an in-place one-shot allreduce.
    if (!L.connections.empty()) L.scratch_mem = allocate_device(*L.connections.front()->transport, scratch_bytes + L.engine.slot_bytes);
    if (extra_slot) *extra_slot = L.scratch_mem ? static_cast<std::byte*>(L.scratch_mem) + scratch_bytes : nullptr;
  }
  L.engine.scratch = static_cast<std::byte*>(L.scratch_mem);
  // Every connection of the lane at once (the same code a link move runs for one).
  std::vector<ConnectSpec> specs;
  specs.reserve(L.connections.size());
  for (auto& ch : L.connections) {
    const LinkId pair = LinkId::of(rank, ch->peer);
    specs.push_back(ConnectSpec{ch.get(), ch->transport, fmt::format("conn{}/{}-{}", suffix, pair.a, pair.b),
                                fmt::format("rank {}: connecting to rank {} over {}", rank, ch->peer, ch->transport_name)});
  }
  connect_connections(L, specs, memory);
}

void Lanes::build(int count) {
  connect(lane0_, 0);
  for (int c = 1; c < count; ++c) {
    auto lane = std::make_unique<LaneState>();
    lane->engine = lane0_.engine;
    follow_lane0(*lane, true);
    connect(*lane, c);
    extra_.push_back(std::move(lane));
  }
  start_workers();
}

void Lanes::connect_connection(LaneState& L, Connection& ch, Transport& to, const std::string& key, MemoryKind inbox_kind,
                               const std::string& what) {
  const ConnectSpec one{&ch, &to, key, what};
  connect_connections(L, std::span(&one, 1), inbox_kind);
}

// In phases, each of which sets all its store keys before it reads any: a collective-only store
// (MpiStore) serves a phase's reads with one round in which every rank delivers that phase's
// keys, so every rank must run the same phases (src/mpi_store.cpp).
void Lanes::connect_connections(LaneState& L, std::span<const ConnectSpec> specs, MemoryKind inbox_kind) {
  const int rank = ctx_.rank;
  const std::string& protocol = ctx_.protocol;
  Store& store = *ctx_.store;
  // 1. Drop any old link; listen; publish the address.
  std::vector<std::unique_ptr<ListenHandle>> listeners;
  listeners.reserve(specs.size());
  for (const ConnectSpec& s : specs) {
    Connection& ch = *s.ch;
    if (ch.link) ch.link->fence(FenceReason::HealthPolicy);
    {
      std::lock_guard lock(links_mutex_);  // links() from another thread may be reading the old link
      ch.link.reset();
      ch.transport_name = std::string(s.to->name());
    }
    ch.peer_inbox = RemoteRegion{};
    ch.peer_flags = RemoteRegion{};
    ch.inbox_region = MemoryRegion{};
    ch.flags_region = MemoryRegion{};
    ch.transport = s.to;
    listeners.push_back(s.to->listen());
    store.set(fmt::format("{}/addr/{}", s.key, rank), listeners.back()->address());
  }
  // 2. Connect, one peer at a time in peer order (the transport decides who dials).
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ConnectSpec& s = specs[i];
    const int peer = s.ch->peer;
    const Bytes address = store.get(fmt::format("{}/addr/{}", s.key, peer), ctx_.options.timeout);
    finish_connect(*s.to->connect(*listeners[i], ctx_.peer(peer), address), *s.ch,
                   std::chrono::steady_clock::now() + ctx_.options.timeout, s.what);
  }
  // 3. Register the lane's flags and the connection's staging slots with the new link; publish
  //    the keys with the data-path options every rank must share.
  const std::size_t inbox_bytes = L.engine.slot_stride() * static_cast<std::size_t>(L.engine.slots);
  for (const ConnectSpec& s : specs) {
    Connection& ch = *s.ch;
    ch.flags_region = s.to->register_memory(L.flags_mem, FlagBlock::bytes(ctx_.size), MemoryKind::Host);
    ch.inbox_region = s.to->register_memory(ch.inbox, inbox_bytes, inbox_kind);
    store.set(fmt::format("{}/regions/{}", s.key, rank), pack({ch.inbox_region.key(), ch.flags_region.key(), to_bytes(protocol)}));
  }
  // 4. Import the peer's.
  for (const ConnectSpec& s : specs) {
    Connection& ch = *s.ch;
    const int peer = ch.peer;
    const auto parts = unpack(store.get(fmt::format("{}/regions/{}", s.key, peer), ctx_.options.timeout), "region keys");
    RINGFENCE_EXPECTS(parts.size() == 3, "rank {}: malformed region keys from rank {}", rank, peer);
    RINGFENCE_EXPECTS(to_string(parts[2]) == protocol,
                      "rank {}: rank {} runs with different data-path options ('{}' vs '{}'): RINGFENCE_CHUNK_BYTES, "
                      "RINGFENCE_SLOTS, RINGFENCE_CHANNELS, RINGFENCE_DIRECT_WRITE_MIN_BYTES, RINGFENCE_CHECKSUM, RINGFENCE_ALGO, "
                      "RINGFENCE_CARRY_MAX_BYTES and RINGFENCE_TUNER_* must match on every rank",
                      rank, peer, to_string(parts[2]), protocol);
    ch.peer_inbox = s.to->import_region(parts[0]);
    ch.peer_flags = s.to->import_region(parts[1]);
  }
}

void* Lanes::allocate(std::size_t bytes) {
  for (auto& t : ctx_.transports)
    if (void* p = t->allocate(bytes, MemoryKind::Host)) {
      allocations_.emplace_back(p, t.get());
      return p;
    }
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p) throw SystemError(fmt::format("rank {}: out of memory allocating {} bytes", ctx_.rank, bytes), ENOMEM);
  std::memset(p, 0, bytes);
  allocations_.emplace_back(p, nullptr);
  return p;
}

std::byte* Lanes::allocate_device(Transport& t, std::size_t bytes) {
  void* p = t.allocate(bytes, MemoryKind::Device);
  if (!p) throw CudaError(fmt::format("rank {}: {} allocates no device memory", ctx_.rank, t.name()), 0);
  allocations_.emplace_back(p, &t);
  return static_cast<std::byte*>(p);
}

void* Lanes::user_alloc(std::size_t bytes) {
  void* p = allocate(bytes);
  user_allocs_.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

namespace {
void release(void* ptr, Transport* t) noexcept {
  if (t)
    t->deallocate(ptr);
  else
    std::free(ptr);
}
}  // namespace

bool Lanes::user_free(void* ptr) noexcept {
  // Only what user_alloc() returned (not internal memory, not another communicator's).
  const auto user = std::find_if(user_allocs_.begin(), user_allocs_.end(),
                                 [&](auto& r) { return r.first == reinterpret_cast<std::uintptr_t>(ptr); });
  const auto it = std::find_if(allocations_.begin(), allocations_.end(), [&](auto& e) { return e.first == ptr; });
  if (user == user_allocs_.end() || it == allocations_.end()) return false;
  user_allocs_.erase(user);
  release(it->first, it->second);
  allocations_.erase(it);
  return true;
}

bool Lanes::owns_user_allocation(const void* ptr) const noexcept {
  return std::any_of(user_allocs_.begin(), user_allocs_.end(), [&](auto& r) { return r.first == reinterpret_cast<std::uintptr_t>(ptr); });
}

bool Lanes::is_user_memory(const void* ptr, std::size_t bytes) const noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  for (const auto& a : user_allocs_)
    if (p >= a.first && p + bytes <= a.first + a.second) return true;
  return false;
}

void Lanes::wire(const PlanState& plan) {
  const std::vector<int>& ring = plan.ring();
  const std::vector<Relay>& relays = plan.relays();
  const int rank = ctx_.rank;
  const std::size_t pos = static_cast<std::size_t>(plan.position()), n = ring.size();
  for_each([&](LaneState& L) {
    L.relay_duties = RelayDuties{};
    L.engine.trailers = !relays.empty();
    L.engine.position = static_cast<int>(pos);
    int left_rank = ring[(pos + n - 1) % n], right_rank = ring[(pos + 1) % n];
    for (const Relay& r : relays) {
      if (r.to == rank) left_rank = r.via;     // our logical left's chunks come through the relay
      if (r.from == rank) right_rank = r.via;  // ours go through it
      if (r.via == rank && L.relay_duties.count < kMaxRelayDuties) {
        RelayDuty& d = L.relay_duties.duty[L.relay_duties.count++];
        d.in = &L.connection_to(r.from);
        d.out = &L.connection_to(r.to);
        d.sender_position = plan.position_of(r.from);
        d.base_in = d.in->received;
        d.base_out = d.out->sent;
        d.credited = static_cast<std::uint32_t>(d.base_in);
      }
    }
    L.left = &L.connection_to(left_rank);
    L.right = &L.connection_to(right_rank);
  });
  position_connection_.assign(n, nullptr);
  for (std::size_t p = 0; p < n; ++p)
    if (ring[p] != rank) position_connection_[p] = &lane0_.connection_to(ring[p]);
}

void Lanes::local_abort(std::uint32_t value) noexcept {
  for_each_and_device([&](LaneState& L) { set_local_abort(L, value); });
}

void Lanes::abort_peers(std::uint32_t value, int skip) noexcept {
  for_each_and_device([&](LaneState& L) { signal_abort(L, ctx_.size, value, skip); });
}

std::vector<LinkInfo> Lanes::links() const {
  std::lock_guard lock(links_mutex_);  // a move may be replacing a link (connect_connection)
  return collect_links(ctx_.rank, lane0_, extra_, device_.load(std::memory_order_acquire));
}

void Lanes::run_jobs(int lanes) {
  {
    std::lock_guard lock(mutex_);
    in_use_ = lanes;
    pending_ = lanes - 1;
    ++round_;
  }
  cv_.notify_all();
  run_job(0);
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

void Lanes::run_job(int l) noexcept {
  LaneState& L = lane(l);
  LaneJob& job = jobs_[static_cast<std::size_t>(l)];
  job.status = run_ring(L.engine, L.flags, L.left, L.right, job.call, *job.reducer, job.direct, L.relay_duties, job.failure);
  if (!job.status.is_ok()) {
    const std::uint32_t value = FlagBlock::abort_value(job.status.code(), ctx_.rank, job.failure.peer);
    for (int o = 0; o < in_use_; ++o)
      if (o != l) set_local_abort(lane(o), value);
  }
}

void Lanes::start_workers() {
  jobs_.resize(extra_.size() + 1);
  for (std::size_t i = 0; i < extra_.size(); ++i)
    threads_.emplace_back([this, l = static_cast<int>(i + 1)] {
      std::uint64_t seen = 0;
      std::unique_lock lock(mutex_);
      for (;;) {
        cv_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        if (l >= in_use_) continue;
        lock.unlock();
        run_job(l);
        lock.lock();
        if (--pending_ == 0) done_cv_.notify_all();
      }
    });
  if (!extra_.empty())
    ctx_.log.info("{} channels: ring collectives of at least {} bytes per channel are split across them", extra_.size() + 1,
                  ctx_.options.channel_min_bytes);
}

void Lanes::stop_workers() noexcept {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void Lanes::fence_all(FenceReason why) noexcept {
  for_each_and_device([why](LaneState& L) {
    for (auto& ch : L.connections)
      if (ch->link) ch->link->fence(why);
  });
}

void Lanes::drop_connections() noexcept {
  for_each_and_device([](LaneState& L) { L.connections.clear(); });
}

void Lanes::release_memory() noexcept {
  for (auto it = allocations_.rbegin(); it != allocations_.rend(); ++it) release(it->first, it->second);
  allocations_.clear();
  user_allocs_.clear();
}

}  // namespace ringfence::detail
