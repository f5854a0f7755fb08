#include "dispatch.hpp"

#include "stream_probe.hpp"

#include <ringfence/error.hpp>

namespace ringfence::detail {

namespace {
// A peer whose call fingerprints keep arriving damaged is warned about at most this often.
constexpr auto kDamagedCallWarningInterval = std::chrono::seconds(10);
}  // namespace

void Dispatch::start(TunerModel tuner, std::size_t oneshot_bytes, const Heartbeat* heartbeat) {
  tuner_ = tuner;
  stream_choice_.start(p_.lanes.main().engine.stream_writes, stream_writes_adapt(p_.ctx));
  oneshot_copy_.resize(oneshot_bytes);
  heartbeat_ = heartbeat;
  damaged_calls_.assign(static_cast<std::size_t>(p_.ctx.size), ReportCoalescer(kDamagedCallWarningInterval));
}

void Dispatch::refuse_in_group(const char* call) const {
  RINGFENCE_EXPECTS(group_depth_ == 0, "rank {}: {}: collectives inside group_start()/group_end() are not supported", p_.ctx.rank,
                    call);
}

// The deadline of the call about to run on every lane: set_timeout()'s value or the default.
void Dispatch::apply_timeout(std::chrono::milliseconds t) noexcept {
  const std::chrono::nanoseconds effective = t.count() > 0 ? t : p_.ctx.options.timeout;
  p_.lanes.for_each_and_device([&](LaneState& L) { L.engine.timeout = effective; });
}

// Every collective starts here: refuse a broken communicator or one a peer left, count the
// call, post its fingerprint, and run the fence agreement when it is due.
void Dispatch::begin_collective(const char* call, CallFingerprint fp, std::span<const std::byte> carried) {
  CommContext& ctx = p_.ctx;
  check_usable(call);
  if (heartbeat_ && heartbeat_->any_left()) {
    // A peer that failed aborted us before it closed: its reason explains the call's failure
    // better than the ranks that left in turn.
    if (const std::uint32_t a = p_.lanes.main().flags.abort->value.load(std::memory_order_acquire); a != 0) {
      ++ctx.seq;
      raise(call, abort_failure(a, "the start of the call", 0));
    }
    // Point-to-point between the others could go on; a collective never can again. Name every
    // rank that left: one that failed on the first leaver and closed in turn may be seen too.
    const std::vector<int> left_ranks = heartbeat_->left_ranks();
    if (!left_ranks.empty()) {
      const std::string why =
          left_ranks.size() == 1
              ? fmt::format("rank {} closed its communicator; a collective needs every rank", left_ranks[0])
              : fmt::format("ranks {} closed their communicators; a collective needs every rank", fmt::join(left_ranks, ", "));
      p_.failure.record(Status(ErrorCode::PeerUnreachable), why);
      throw PeerUnreachableError(fmt::format("rank {}: {}: {}", ctx.rank, call, why));
    }
  }
  ++ctx.seq;
  p_.calls.reset();
  const bool agree = p_.agreement.enabled() && p_.agreement.due(fp.count * size_of(static_cast<DataType>(fp.type)));
  if (ctx.options.check_calls && ctx.size > 1) {
    Failure failure;
    // A carried call posts last, right before it waits (RingRunner::run_carried), unless an
    // agreement needs the fingerprints compared first.
    if (!carried.empty() && !agree) p_.calls.prepare(fp, ctx.seq, carried);
    else if (!p_.calls.post(p_.lanes.main(), fp, ctx.seq, failure, carried).is_ok()) raise(call, failure);
  }
  if (agree) {
    // The agreement may fence or move the link the fingerprints travel on and re-plan who
    // checks whom: compare them first, over the plan they were posted on.
    settle_call(call);
    Failure failure;
    if (!p_.agreement.run(failure).is_ok()) raise(fmt::format("fence agreement before {}", call).c_str(), failure);
    if (!ctx.options.health_prometheus.empty()) write_metrics();
  }
  refresh_metrics_if_due();
}

// The same answer on both ranks for the same call: the options are the same on every rank
// (the communicator's setup compares them), and so are the size, the fence list (which decides
// whether a neighbour's call is checked) and whether the call runs on the device lane.
bool Dispatch::carries(std::size_t bytes) noexcept {
  const CommOptions& o = p_.ctx.options;
  return p_.ctx.size == 2 && bytes > 0 && bytes <= o.carry_max_bytes && o.check_calls && p_.calls.checks() && !p_.device.current() &&
         (o.algorithm == Algorithm::Auto || o.algorithm == Algorithm::OneShot);
}

// A carried allreduce after its post (begin_collective): the peer's post brings its input.
void Dispatch::run_carried_call(const char* call, const void* send, void* recv, std::size_t count, const Reducer& reducer) {
  LaneState& lane0 = p_.lanes.main();
  CallCheck* check = p_.calls.pending();
  CallCheck judged;
  if (!check->from) {  // a fence agreement at the call's start judged it already (and may have re-paired the ranks)
    judged.from = &lane0.connection_to(1 - p_.ctx.rank);
    judged.mine = check->mine;  // posted before the agreement
    judged.damage_counted = check->damage_counted;
    check = &judged;
  }
  Failure failure;
  const Status s =
      run_carried(lane0.engine, lane0.flags, lane0.left, lane0.right, lane0.relay_duties, *check, send, recv, count, reducer, failure);
  if (check == &judged) *p_.calls.pending() = judged;  // judged again below: a disagreement read after the agreement is named too
  judge_call(call);  // first: a disagreement explains a failure better than what it caused
  if (!s.is_ok()) raise(call, failure);
}

// The timed refresh: a scrape (or `ringfence-health --live`) during a run sees current figures,
// not only those of the last agreement; point-to-point groups call it too (a send/recv-only job
// runs no agreement). One clock read per call, only with the file set.
void Dispatch::refresh_metrics_if_due() {
  const CommOptions& o = p_.ctx.options;
  if (!o.health_prometheus.empty() && o.health_prometheus_interval.count() > 0 && std::chrono::steady_clock::now() >= metrics_due_)
    write_metrics();
}

void Dispatch::write_metrics() {
  const CommContext& ctx = p_.ctx;
  const HealthMonitor* monitor = p_.agreement.monitor();
  write_prometheus(ctx.options.health_prometheus, ctx.rank,
                   make_snapshot(ctx.rank, ctx.seq, p_.plan, monitor, p_.agreement.count(), p_.lanes.links()), ctx.log);
  metrics_due_ = std::chrono::steady_clock::now() + ctx.options.health_prometheus_interval;
}

// Compares the fingerprints now, before the call moves data: for calls that cannot leave it to
// the executor (CallChecker::can_defer).
void Dispatch::settle_call(const char* call) {
  Failure failure;
  if (!p_.calls.settle(p_.lanes.main(), failure).is_ok()) raise(call, failure);
  judge_call(call);
}

// After the data phase (or when it failed): a disagreement fails the call on this rank and
// aborts the others (InvalidUsage naming both ranks and both calls). A failed data phase may
// have been cut short by the peer that found the disagreement first: its fingerprint explains
// the failure better than its abort does.
void Dispatch::judge_call(const char* call) {
  CommContext& ctx = p_.ctx;
  const CallChecker::Verdict v = p_.calls.judge(p_.lanes.main().flags);
  if (v.kind == CallChecker::Verdict::Damaged) {
    // A link that keeps damaging them (one with no route around stays in use) is named once a
    // kDamagedCallWarningInterval, with the count held back, not at every call.
    ReportCoalescer& held = damaged_calls_[static_cast<std::size_t>(v.from->peer)];
    const auto now = std::chrono::steady_clock::now();
    const auto since = held.last_report();
    const std::uint64_t n = held.add(1, now);
    if (n == 0) return;
    const std::string more = n == 1 ? std::string()
                                    : fmt::format(" (and {} more calls since the last warning, {:.1f} s ago)", n - 1,
                                                  std::chrono::duration<double>(now - since).count());
    ctx.log.warn("collective #{}: the call fingerprint from rank {} arrived damaged or not at all ({} link); not compared{}", ctx.seq,
                 v.from->peer, v.from->transport_name, more);
    return;
  }
  if (v.kind != CallChecker::Verdict::Disagree) return;
  const int peer = v.from->peer;
  p_.failure.abort_peers(ErrorCode::InvalidUsage, peer);
  // Equal arguments, but one rank carried its data in the fingerprint and the other did not: one
  // call ran on the device lane (stream-ordered, device memory) and the other on the host, or
  // the libraries differ (setup compares the options).
  const bool carry_differs = v.mine.carried != v.theirs.carried && describe(v.mine) == describe(v.theirs);
  const std::string why = fmt::format(
      "the ranks disagree on collective #{}: rank {} called {}, rank {} called {} (every rank must make the same collective "
      "calls in the same order, with the same count, datatype, op and root){}",
      ctx.seq, ctx.rank, describe(v.mine), peer, describe(v.theirs),
      carry_differs ? fmt::format("; rank {} carried its data in the call fingerprint and rank {} did not: one call is stream-ordered "
                                  "on device memory and the other on the host, or the ringfence versions differ",
                                  v.mine.carried ? ctx.rank : peer, v.mine.carried ? peer : ctx.rank)
                    : std::string());
  p_.failure.record(Status(ErrorCode::InvalidUsage), why);
  const std::string message = fmt::format("rank {}: {} #{} refused: {}", ctx.rank, call, ctx.seq, why);
  ctx.log.error("{}", message);
  throw InvalidUsage(message);
}

// Runs a ring collective. `direct`: final values may go straight into the right neighbour's
// output (allreduce, allgather, broadcast). Large calls are split across the lanes.
void Dispatch::run_ring_call(const char* call, const RingCall& c, const Reducer& reducer, bool direct) {
  if (p_.device.current()) return run_device_call(call, c, reducer);
  timed_for_stream_choice(static_cast<int>(c.kind), c.count * reducer.elem_size, [&] { run_host_ring_call(call, c, reducer, direct); });
}

StreamChoice::Call Dispatch::begin_stream_choice(int kind, std::size_t bytes) noexcept {
  // Outside trials the lanes already hold the current kind (set at setup, restored after each trial).
  const StreamChoice::Call sc = stream_choice_.begin(kind, bytes, p_.ctx.seq);
  if (sc.trial) set_stream_writes(sc.stream);
  return sc;
}

void Dispatch::end_stream_choice(const StreamChoice::Call& sc, std::chrono::steady_clock::time_point started) {
  const StreamChoice::Outcome o = stream_choice_.end(sc, std::chrono::steady_clock::now() - started);
  if (sc.trial) set_stream_writes(stream_choice_.current());
  if (o.switched)
    p_.ctx.log.info("stream writes {}: collective #{} ({} bytes) took {:.1f} us with them against {:.1f} us at best before",
                    stream_choice_.current() ? "on" : "off", sc.seq, sc.bytes, o.trial_ns / 1e3, o.previous_ns / 1e3);
  else if (sc.trial)
    p_.ctx.log.debug("stream writes {}: collective #{} ({} bytes) tried them {}", stream_choice_.current() ? "on" : "off", sc.seq,
                     sc.bytes, sc.stream ? "on" : "off");
}

void Dispatch::set_stream_writes(bool stream) noexcept {
  p_.lanes.for_each([&](LaneState& L) { L.engine.stream_writes = stream; });
}

// A ring, tree, direct or one-shot schedule on the host lanes (several lanes: each a slice).
void Dispatch::run_host_ring_call(const char* call, const RingCall& c, const Reducer& reducer, bool direct) {
  p_.regs.begin_call();
  LaneState& lane0 = p_.lanes.main();
  const int lanes = lanes_for(c, reducer.elem_size);
  const bool by_checked = p_.calls.can_defer(lane0, c, lanes, p_.ctx.size);  // false when there is none or it was judged
  const bool paired = !by_checked && p_.calls.can_pair(lane0, c, lanes, p_.ctx.size);
  if (paired) {  // every sender compared before its chunk is used, not the checked rank before anything moves
    Failure failure;
    if (!p_.calls.pair(lane0, failure).is_ok()) raise(call, failure);
  }
  const bool deferred = by_checked || paired;
  if (!deferred) settle_call(call);
  if (lanes <= 1) {
    RingCall checked = c;
    if (deferred) checked.check = p_.calls.pending();
    Failure failure;
    const Status s = run_ring(lane0.engine, lane0.flags, lane0.left, lane0.right, checked, reducer,
                              direct ? direct_write_for(lane0, c, reducer.elem_size) : DirectWrite{}, lane0.relay_duties, failure);
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
    RingCall part = c;
    part.count = hi - lo;
    part.send = c.send ? static_cast<const std::byte*>(c.send) + lo * es : nullptr;
    part.recv = c.recv ? static_cast<std::byte*>(c.recv) + lo * es : nullptr;
    if (c.kind == RingCollective::ReduceScatter || c.kind == RingCollective::Allgather) part.stride = c.stride ? c.stride : total;
    LaneJob& job = p_.lanes.job(l);
    job.call = part;
    job.reducer = &reducer;
    job.direct = direct ? direct_write_for(p_.lanes.lane(l), part, es) : DirectWrite{};
    job.failure = Failure{};
    job.status = Status::ok();
  }
  p_.lanes.run_jobs(lanes);
  // The first failure that did not come from a sibling lane's local abort explains the call.
  const int rank = p_.ctx.rank;
  const LaneJob* failed_job = nullptr;
  for (int l = 0; l < lanes; ++l) {
    const LaneJob& job = p_.lanes.job(l);
    if (job.status.is_ok()) continue;
    const bool sibling = job.failure.aborted_by_peer && job.failure.peer == rank;
    if (!failed_job || (!sibling && failed_job->failure.aborted_by_peer && failed_job->failure.peer == rank)) failed_job = &job;
  }
  if (failed_job) raise(call, failed_job->failure);
}

// The device lane: the plan's ring order, the fingerprint compared first.
void Dispatch::run_device_call(const char* call, const RingCall& c, const Reducer& reducer) {
  settle_call(call);
  Failure failure;
  const Status s = p_.device.run(call, c, reducer, failure);
  judge_call(call);
  if (!s.is_ok()) raise(call, failure);
}

// Lanes a ring collective of `c` uses: 1 unless several exist, the collective is one that
// splits (ring allreduce, reduce-scatter, allgather, chain broadcast and reduce) and every lane
// gets at least `channel_min_bytes`. The same on every rank (same call, same options).
int Dispatch::lanes_for(const RingCall& c, std::size_t elem_size) const noexcept {
  if (p_.lanes.count() == 1) return 1;
  switch (c.kind) {
    case RingCollective::Allreduce:
    case RingCollective::ReduceScatter:
    case RingCollective::Allgather:
    case RingCollective::Broadcast:
    case RingCollective::Reduce: break;
    default: return 1;
  }
  const std::size_t bytes = c.count * elem_size;
  const std::size_t per = std::max<std::size_t>(p_.ctx.options.channel_min_bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(bytes / per, 1, static_cast<std::size_t>(p_.lanes.count())));
}

const RemoteRegion* Dispatch::resolve_remote(void* ctx, std::span<const std::byte> key) noexcept {
  auto& self = *static_cast<Dispatch*>(ctx);
  return self.p_.regs.import(key, *self.p_.lanes.main().right);
}

// Direct writes of final values into the right neighbour's output (ring allreduce, allgather and
// broadcast) for call `c` on `lane`: enabled from `direct_write_min_bytes` without checksums.
DirectWrite Dispatch::direct_write_for(LaneState& lane, const RingCall& c, std::size_t elem_size) {
  const CommContext& ctx = p_.ctx;
  // The output this call writes: one range, or (allgather) `size` blocks `stride` apart.
  void* recv = c.recv;
  const std::size_t blocks = c.kind == RingCollective::Allgather ? static_cast<std::size_t>(ctx.size) : 1;
  const std::size_t bytes = ((blocks - 1) * (c.stride ? c.stride : c.count) + c.count) * elem_size;
  DirectWrite direct;
  // With checksums every chunk goes through staging: a corrupted chunk must land where it can
  // be verified and replaced, not in the output; and the key exchange a direct write needs is
  // a mailbox without re-sends, which a lossy link would fail.
  if (ctx.size > 1 && bytes >= ctx.options.direct_write_min_bytes && !p_.lanes.main().engine.checksum) {
    // Every rank takes part in the key exchange (same decision everywhere: same size and
    // options); each decides for its own output whether the left neighbour writes into it.
    direct.enabled = true;
    direct.call = static_cast<std::uint32_t>(ctx.seq);
    if (p_.lanes.is_user_memory(recv, bytes) || bytes >= ctx.options.direct_write_user_min_bytes ||
        lane.left->transport->traits().cheap_user_writes)
      direct.own_key = p_.regs.local_key(recv, bytes, lane.left->transport);
    direct.resolve = &Dispatch::resolve_remote;
    direct.ctx = this;
  }
  return direct;
}

void Dispatch::raise(const char* call, const Failure& f) {
  const CommContext& ctx = p_.ctx;
  // A local abort (abort(), or the heartbeat found a peer gone) recorded its reason first. A
  // peer's abort word may have replaced ours since (a peer writes it with a plain store), so a
  // reason recorded by another thread during this call is this rank's answer either way.
  if (f.aborted_by_peer && (f.peer == ctx.rank || p_.failure.failed())) {
    const auto [s, why] = p_.failure.get();
    if (!s.is_ok()) {
      // Ranks waiting on us learn it now (this thread drives the links). The word we saw names
      // whom to blame: ours, or a peer's that failed on the same cause (a stopped rank: our
      // heartbeat recorded it while the peer's word arrived).
      p_.failure.abort_peers(s.code(), f.blamed);
      throw_status(s, fmt::format("rank {}: {} #{} failed: {}", ctx.rank, call, ctx.seq, why));
    }
  }
  if (f.aborted_by_peer && f.peer != ctx.rank && f.peer >= 0) {
    // Another rank failed and told us: pass it on before anything here closes a link, so a rank
    // that waits on us and has not heard from it names it, not our exit (seen with 8 ranks on
    // tcp: a rank blamed its neighbour, which had only gone on to destroy its communicator).
    p_.failure.forward_abort(f.status.code(), f.peer, f.blamed);
  }
  if (!f.aborted_by_peer) {
    // A timeout while some rank's heartbeat is overdue most likely ends at that rank: blame
    // it, so the others name it too (not the neighbour that was itself waiting on it).
    std::int64_t age_ms = 0;
    const int silent = f.status.code() == ErrorCode::Timeout && heartbeat_ ? heartbeat_->silent_peer(age_ms) : -1;
    p_.failure.abort_peers(f.status.code(), silent >= 0 ? silent : f.peer);
  }
  // The link: the one the executor failed on (it names its transport), else lane 0's to the peer.
  const std::string* transport =
      f.transport ? f.transport : f.peer >= 0 && f.peer != ctx.rank ? &p_.lanes.main().connection_to(f.peer).transport_name : nullptr;
  const FailureReport r = describe_failure(ctx.rank, call, ctx.seq, f, transport, p_.lanes.main().engine.timeout,
                                           heartbeat_ && f.status.code() == ErrorCode::Timeout ? heartbeat_->silent_peer_note() : std::string());
  p_.failure.record(r.status, r.message);
  ctx.log.error("{}", r.message);
  throw_status(r.status, r.message);
}

}  // namespace ringfence::detail
