// Building a communicator's parts (control plane: may block, allocate, throw), and tearing
// them down.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>

#include "../health/gpu_topology.hpp"
#include "comm_impl.hpp"
#include "stream_probe.hpp"

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

// Inter-host hops (tcp over a 10 GbE-class network): the tuner model's per-hop cost and bandwidth.
constexpr double kInterHostAlphaUs = 25.0;
constexpr double kInterHostGbps = 1.25;

}  // namespace

void Communicator::Impl::setup(const TransportRegistry& reg) {
  CommOptions& options = ctx.options;
  const int rank = ctx.rank, size = ctx.size;
  RINGFENCE_EXPECTS(size >= 1, "Communicator: size must be >= 1 (got {})", size);
  RINGFENCE_EXPECTS(rank >= 0 && rank < size, "Communicator: rank {} is out of range for size {}", rank, size);
  RINGFENCE_EXPECTS(options.timeout.count() > 0, "rank {}: CommOptions::timeout must be positive", rank);
  RINGFENCE_EXPECTS(options.slots >= 1 && options.slots <= 64, "rank {}: CommOptions::slots must be in [1, 64] (got {})", rank,
                    options.slots);
  RINGFENCE_EXPECTS(options.chunk_bytes > 0, "rank {}: CommOptions::chunk_bytes must be positive", rank);
  RINGFENCE_EXPECTS(options.carry_max_bytes <= detail::kCarryMaxBytes, "rank {}: CommOptions::carry_max_bytes must be at most {} (got {})", rank,
                    detail::kCarryMaxBytes, options.carry_max_bytes);
  RINGFENCE_EXPECTS(options.health_gpu >= CommOptions::kHealthGpuFromCuda,
                    "rank {}: CommOptions::health_gpu must be an NVML index, -1 (none) or kHealthGpuFromCuda (-2) (got {})", rank,
                    options.health_gpu);
  RINGFENCE_EXPECTS(ctx.store != nullptr, "rank {}: store must not be null", rank);
  ctx.log = make_logger(options.log_level, rank, options.log_file, options.log_timestamps);
  events.open(options.health_log, rank);

  ctx.self = PeerInfo{rank, options.host_id.empty() ? default_host_id() : options.host_id, static_cast<std::int32_t>(::getpid())};
  ctx.self.cpu = detail::bound_cpu();
  const TransportContext tctx{ctx.self, size, &options, &ctx.log};
  const std::vector<FaultRule> faults = parse_fault_spec(options.fault);
  for (const FaultRule& f : faults)  // a rule for a link this job does not have would silently do nothing
    RINGFENCE_EXPECTS(f.rank_a < size && f.rank_b < size, "rank {}: RINGFENCE_FAULT='{}': link={}-{} names a rank outside this job of {} ranks",
                      rank, options.fault, f.rank_a, f.rank_b, size);
  for (const auto& name : reg.select(options.transports)) {
    auto t = reg.create(name, tctx);
    ctx.transports.push_back(faults.empty() ? std::move(t) : make_fault_transport(std::move(t), faults, rank));
  }
  if (!faults.empty()) ctx.log.warn("fault injection active: {}", options.fault);
  RINGFENCE_EXPECTS(!ctx.transports.empty(), "rank {}: no transports registered", rank);
  if (options.fallbacks) {
    ctx.fallbacks = *options.fallbacks;
  } else {  // what the selected transports declare
    for (const auto& t : ctx.transports)
      for (const std::string& to : t->traits().fallbacks) ctx.fallbacks.emplace_back(std::string(t->name()), to);
  }

  detail::EngineConfig& engine = lanes.main().engine;
  engine.rank = rank;
  engine.size = size;
  engine.slots = options.slots;
  engine.slot_bytes = std::max<std::size_t>(64, (options.chunk_bytes + 63) / 64 * 64);
  engine.timeout = options.timeout;
  engine.checksum = options.checksum;
  // The link map's syntax is checked before anything connects.
  bool automatic_map = false;
  std::vector<detail::LinkSource> link_map = detail::parse_link_map(options.health_link_map, &automatic_map);
  const detail::GpuTopology gpu = detail::read_gpu_topology(options, size, ctx.log, ctx.self);
  ctx.log.info("rank {}/{} on host '{}': transports {}, chunk {} B x {} slots, timeout {} ms", rank, size, ctx.self.host_id,
               fmt::join(reg.select(options.transports), ","), engine.slot_bytes, engine.slots, options.timeout.count());

  // Kernels into the GPU's context before any stream-ordered call can hold a stream (and, for
  // ranks sharing a process, before any rank passes the setup barrier below).
  device.prepare();

  if (size == 1) {
    dispatch.start(TunerModel{}, 0, nullptr);
    return;
  }

  // 1. Publish who we are; learn who the others are. A connection goes to every peer (one host,
  //    small rank counts): re-planning the ring around a fenced link then needs no new
  //    connections. With two ranks left == right: one connection carries both directions.
  ctx.store->set(fmt::format("peer/{}", rank), serialize(ctx.self));
  ctx.peer_info.assign(static_cast<std::size_t>(size), ctx.self);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    PeerInfo info = deserialize_peer_info(ctx.store->get(fmt::format("peer/{}", p), options.timeout));
    RINGFENCE_EXPECTS(info.rank == p, "rank {}: the store holds inconsistent peer info for rank {}", rank, p);
    ctx.peer_info[static_cast<std::size_t>(p)] = std::move(info);
  }

  // 2. A transport per peer; a transport may want larger chunks (tcp: each chunk costs a wake-up
  //    and a signal round). Every rank sees the same links' preferences (a job spread over hosts
  //    gives every rank a network link); the protocol fingerprint checks it.
  const std::size_t min_chunk = lanes.choose_transports();
  if (min_chunk > engine.slot_bytes) engine.slot_bytes = (min_chunk + 63) / 64 * 64;

  // Ranks outnumbering the CPUs wait for peers that must be scheduled first: waits leave the
  // spin for the link's wait, which yields, almost at once (EngineConfig::spin_polls). With a
  // CPU per rank and only shared-memory links chosen, a checked call waits for receivers about
  // to accept its last chunk rather than copy it aside (EngineConfig::retain_max_bytes). A
  // local choice: ranks may differ. Where every rank of the host has a core of its own (bound;
  // CommOptions::spin), waits spin long before the link's wait: a yield costs ~1 µs even when
  // it comes straight back. Not with several lanes, whose threads share the rank's one CPU, and
  // never where the ranks outnumber the CPUs (there the peer must run first, even with `on`).
  const bool spin_long = !ctx.oversubscribed() &&
                         (options.spin == SpinMode::On ||
                          (options.spin == SpinMode::Auto && ctx.dedicated_cores() && lanes.lane_count() == 1));
  engine.fit_to_host(ctx.oversubscribed(), lanes.has_network_link(), spin_long);
  if (spin_long)
    ctx.log.info("waits spin up to {} polls before yielding ({})", engine.spin_polls,
                 options.spin == SpinMode::On ? "RINGFENCE_SPIN=on" : fmt::format("every rank of the host bound to a CPU of its own; this one to CPU {}", ctx.self.cpu));
  // Chunks into peers' slots with streaming stores where this host hands them over faster so:
  // the host's lowest rank probes now, every rank reads its answer once the lanes connected
  // (their store round carries it). Local too.
  detail::publish_stream_writes(ctx);

  // With health on every link of this rank is judged on its transport's evidence (checksum
  // errors, timeouts; speeds are compared across the job by the agreement itself), mapped
  // links on their hardware counters too.
  std::unique_ptr<detail::HealthMonitor> monitor;
  if (options.health_enabled || !options.health_link_map.empty()) {
    std::vector<LinkId> own;
    if (options.health_enabled)
      for (int p = 0; p < size; ++p)
        if (p != rank) own.push_back(LinkId::of(rank, p));
    if (automatic_map) {
      std::vector<detail::LinkSource> found = detail::nvlink_map(rank, gpu, ctx.self, ctx.peer_info, ctx.log);
      link_map.insert(link_map.end(), found.begin(), found.end());
    }
    monitor = std::make_unique<detail::HealthMonitor>(options.health, std::move(link_map), std::move(own), ctx.log);
  }
  detail::HealthMonitor* const monitor_view = monitor.get();
  agreement.start(std::move(monitor));
  mover.start();

  // 3. Connect lane 0, then the extra lanes (RINGFENCE_CHANNELS), each with its own links, flags
  //    and staging slots; the same transport per peer on every lane. The protocol fingerprint
  //    holds every data-path option the ranks must share (the user threshold may differ).
  const int planned = lanes.lane_count();
  ctx.protocol = fmt::format(
      "v2 slot_bytes={} slots={} direct_write_min_bytes={} checksum={} agree_every={}/{}/{}/{} agreement={} digest_every={} "
      "algo={} tuner={}/{}{} channels={}/{} check_calls={} heartbeat={} carry={}",
      engine.slot_bytes, engine.slots, options.direct_write_min_bytes, engine.checksum, options.health_agree_every,
      options.health_agree_bytes, options.health_slow_factor, options.health_agree_min_interval.count(), agreement.enabled(),
      options.digest_every, static_cast<int>(options.algorithm), options.tuner_alpha_us, options.tuner_gbps,
      ctx.network_only() ? "/network" : "", planned, options.channel_min_bytes, options.check_calls,
      options.effective_heartbeat().count() > 0, options.carry_max_bytes);
  lanes.build(planned);
  // The heartbeat's own links (one per peer, tiny staging), driven only by its thread.
  if (options.effective_heartbeat().count() > 0) {
    heartbeat = std::make_unique<detail::Heartbeat>(rank, size, options.effective_heartbeat(), options.timeout, ctx.log,
                                                    [this](int peer, ErrorCode code, const std::string& why) {
                                                      if (!failure.record(Status(code), why)) return;
                                                      ctx.log.error("{}", why);
                                                      failure.local_abort(code, peer);
                                                    });
    detail::LaneState& beat = heartbeat->lane();
    beat.engine = engine;
    beat.engine.slots = 1;
    beat.engine.slot_bytes = 64;
    lanes.follow_lane0(beat, false);
    lanes.connect(beat, detail::kBeatLane);
  }

  const bool stream_writes = detail::read_stream_writes(ctx);
  // The workers already run but read a lane's engine only for work handed to them later.
  for (int l = 0; l < planned; ++l) lanes.lane(l).engine.stream_writes = stream_writes;

  // 4. The home ring: each host's ranks next to each other (hosts in order of their lowest
  //    rank), so a ring crosses between hosts once per host and direction; within a host
  //    NVLink-joined (or same-GPU) ranks are neighbours where the GPUs are known, else ranks
  //    ascend. Every rank derives it from the same peer list (`plan_home_ring`).
  std::vector<RankPlacement> placement;
  placement.reserve(ctx.peer_info.size());
  for (const PeerInfo& p : ctx.peer_info) placement.push_back(placement_of(p));
  std::vector<int> home = plan_home_ring(placement);
  int joined_hops = 0;
  for (int i = 0; i < size; ++i)
    joined_hops += gpu_joined(placement, home[static_cast<std::size_t>(i)], home[static_cast<std::size_t>((i + 1) % size)]);
  if (joined_hops > 0) ctx.log.info("planner: home ring {} ({} of {} hops NVLink or same GPU)", fmt::join(home, ","), joined_hops, size);
  int hosts = 0;  // distinct host ids
  for (auto it = ctx.peer_info.begin(); it != ctx.peer_info.end(); ++it)
    hosts += std::none_of(ctx.peer_info.begin(), it, [&](const PeerInfo& q) { return q.host_id == it->host_id; });
  // The tuner's model: across hosts, or with no shared-memory transport selected, the slowest
  // hop is a network link (tcp's figures). Both are the same on every rank (host ids are
  // global; the transport selection is in the protocol fingerprint).
  TunerModel tuner{options.tuner_alpha_us, options.tuner_gbps};
  if (hosts > 1 || ctx.network_only()) {
    tuner.alpha_us = std::max(tuner.alpha_us, kInterHostAlphaUs);
    tuner.gbps = std::min(tuner.gbps, kInterHostGbps);
    tuner.pair_oneshot_bytes = 0;  // measured on shared memory: a network hop has no such cliff
  }
  plan.start(rank, home);
  set_plan(detail::Plan{std::move(home), {}});  // installs the home ring
  dispatch.start(tuner, engine.slot_bytes, heartbeat.get());

  // 5. Everyone is wired: the store is no longer needed by this communicator's data path.
  const std::string key = "barrier/setup";
  if (ctx.store->add(key, 1) == size) ctx.store->set(key + "/done", to_bytes("1"));
  (void)ctx.store->get(key + "/done", options.timeout);
  if (monitor_view) monitor_view->start(options.health_interval);
  if (heartbeat) heartbeat->start();
  const detail::LaneState& lane0 = lanes.main();
  ctx.log.info("connected: left rank {} over {}, right rank {} over {}", lane0.left->peer, lane0.left->transport_name,
               lane0.right->peer, lane0.right->transport_name);
}

void Communicator::Impl::set_plan(detail::Plan p) {
  plan.install(std::move(p));
  lanes.wire(plan);
  // Call fingerprints go along the ring: each rank checks the nearest rank before it whose link
  // to it is not fenced.
  calls.wire(plan.ring(), ctx.rank, lanes.main(), [&](int a, int b) { return plan.is_fenced(a, b); });
}

HealthSnapshot Communicator::Impl::snapshot() const {
  const detail::HealthMonitor* monitor = agreement.monitor();
  return detail::make_snapshot(ctx.rank, ctx.seq, plan, monitor, agreement.count(), lanes.links());
}

Communicator::Impl::~Impl() {
  queue.stop();                       // queued work finishes first (bounded; fails fast after an error)
  if (!failure.failed() && ctx.size > 1) {
    // Chunks our last calls left for their receivers to verify (checksum mode), and our last
    // carried post: serve re-sends and re-posts until they are accepted (a peer still in that
    // call may find one damaged), for a second at most.
    const auto limit = std::min<std::chrono::nanoseconds>(lanes.main().engine.timeout, std::chrono::seconds(1));
    detail::drain_retained(lanes.main().engine, lanes.main().flags, std::chrono::steady_clock::now() + limit);
  }
  if (heartbeat) heartbeat->stop();   // says goodbye to every peer
  agreement.stop();                   // the health monitor's sampler
  lanes.stop_workers();
  // After a failure a peer may be dead or stopped: transports must not wait for its goodbye.
  const FenceReason why = failure.failed() ? FenceReason::Error : FenceReason::Shutdown;
  lanes.fence_all(why);
  regs.clear_remote();
  regs.clear_local();
  lanes.drop_connections();  // links, then regions, before the memory they describe
  device.destroy_stream();
  if (heartbeat) heartbeat->close(why);
  lanes.release_memory();
}

}  // namespace ringfence
