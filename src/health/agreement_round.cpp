#include "agreement_round.hpp"

#include <algorithm>
#include <cmath>
#include <ringfence/crc32c.hpp>
#include <ringfence/error.hpp>

#include "../quarter_octaves.hpp"

namespace ringfence::detail {

namespace {
// Bandwidth evidence needs at least this much timed traffic on a link between agreements.
constexpr std::uint64_t kBandwidthEvidenceBytes = 1 << 20;
// A link's median write speed needs at least this many timed writes between agreements.
constexpr std::uint32_t kSpeedEvidenceWrites = 8;
// Agreements in a row at which a link (or rank) must be judged slow before it is fenced (reported).
constexpr std::uint8_t kSlowStreak = 3;
// At most one checksum_errors event per link in this time, after the first (ReportCoalescer).
constexpr auto kChecksumReportInterval = std::chrono::seconds(1);
// At most one warning per link in this time about corrupted point-to-point chunks, after the first.
constexpr auto kP2PWarningInterval = std::chrono::seconds(10);
}  // namespace

void AgreementRound::start(std::unique_ptr<HealthMonitor> monitor) {
  monitor_ = std::move(monitor);
  ballot_.resize(ctx_.size);
  digests_.resize(static_cast<std::size_t>(ctx_.size));
  sent_.reserve(std::max(ballot_.bytes(), digests_.size() * sizeof(std::uint64_t)));
  slow_streak_.assign(static_cast<std::size_t>(ctx_.size) * static_cast<std::size_t>(ctx_.size), 0);
  straggler_streak_.assign(static_cast<std::size_t>(ctx_.size), 0);
  observations_.reserve(static_cast<std::size_t>(ctx_.size));
  checksum_reports_.assign(static_cast<std::size_t>(ctx_.size), ReportCoalescer(kChecksumReportInterval));
  checksum_counted_.assign(static_cast<std::size_t>(ctx_.size), 0);
  p2p_warnings_.assign(static_cast<std::size_t>(ctx_.size), ReportCoalescer(kP2PWarningInterval));
  timed_.reserve(static_cast<std::size_t>(ctx_.size));
  every_ = base_every();
  last_agreement_ = std::chrono::steady_clock::now();
  if (enabled()) ledger_.load(ctx_);
}

void AgreementRound::stop() noexcept {
  if (monitor_) monitor_->stop();
  // Mismatches held back (ReportCoalescer) go out now, so the events' counts add up to the job's.
  for (std::size_t peer = 0; peer < checksum_reports_.size(); ++peer)
    if (const std::uint64_t n = checksum_reports_[peer].take_held()) {
      const LinkId l = LinkId::of(ctx_.rank, static_cast<int>(peer));
      emit(HealthEvent{EventKind::ChecksumErrors, ctx_.rank, l.a, l.b, 0, 0, n, {}, 0});
    }
}

bool AgreementRound::enabled() const noexcept {
  return ctx_.size > 1 && ctx_.options.health_enabled && ctx_.options.health_agree_every > 0 && monitor_;
}

bool AgreementRound::due(std::uint64_t bytes) noexcept {
  ++calls_since_;
  bytes_since_ += bytes;
  const std::size_t every_bytes = ctx_.options.health_agree_bytes;
  // Links the ledger holds in quarantine are fenced before the first collective moves data.
  if (!ledger_.first_vote_pending() && calls_since_ < every_ && (every_bytes == 0 || bytes_since_ < every_bytes)) return false;
  calls_counted_ = calls_since_;
  calls_since_ = bytes_since_ = 0;
  return true;
}

// How long `health_agree_every` collectives took here since the last agreement, into the ballot.
// The time between agreements includes whatever the caller did between collectives, so a job
// that computes between them reports them slow and keeps agreeing by count. The first agreement
// reports no pace: the time since setup includes waiting for the last rank to reach its first
// collective (a rank slow to start, under load, made the first stretch shorter and the count of
// agreements depend on how the job started), so pacing starts at the first agreement, where all
// ranks met.
void AgreementRound::report_pace(std::chrono::steady_clock::time_point now) noexcept {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_agreement_).count();
  last_agreement_ = now;
  if (agreements_ == 1 || calls_counted_ == 0 || ns <= 0) return;
  ballot_.report_pace(quarter_octaves(static_cast<std::uint64_t>(ns) / calls_counted_ * base_every()));
}

// The count to the next agreement, the same on every rank: it depends on the reduced ballot,
// the options (in the protocol fingerprint) and the streaks, which follow from earlier ballots.
void AgreementRound::pace_next() noexcept {
  every_ = base_every();
  auto streak = [](const std::vector<std::uint8_t>& v) { return std::any_of(v.begin(), v.end(), [](std::uint8_t s) { return s != 0; }); };
  if (ballot_.any_vote() || streak(slow_streak_) || streak(straggler_streak_)) return;  // busy: agree again soon
  const auto min_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(ctx_.options.health_agree_min_interval).count();
  every_ <<= pace_shift(ballot_.pace(), static_cast<std::uint64_t>(std::max<std::int64_t>(min_ns, 0)));
}

// Proposals and readmissions come from the links' policies: this rank's links judged on what
// the transport saw since the last agreement (checksum mismatches, intact chunks, timeouts,
// achieved bandwidth), mapped links on their hardware counters as well.
void AgreementRound::observe() {
  const int rank = ctx_.rank;
  auto propose = [&](LinkId l, std::uint64_t count, const std::string& why) {
    ballot_.vote(l, Vote::Fence);
    ledger_.note_reason(l, why);
    ctx_.log.warn("proposing to fence link {}-{}: {}", l.a, l.b, why);
    emit(HealthEvent{EventKind::FenceProposed, rank, l.a, l.b, 0, 0, count, why, 0});
  };
  const auto& conns = lanes_.main().connections;
  // One observation per peer, summed over the lanes (each lane has its own link to it).
  observations_.clear();
  for (auto& ch : conns) observations_.push_back(TransportObservation{LinkId::of(rank, ch->peer)});
  timed_.assign(conns.size(), {0, 0});
  // What connection `ch` saw since the last agreement, into `o` and its timed traffic `t`.
  auto judge = [](Connection& ch, TransportObservation& o, std::pair<std::uint64_t, std::uint64_t>& t) {
    auto& j = ch.judged;
    const LinkStats& st = ch.link->stats();
    const std::uint64_t timeouts = st.timeouts.load(std::memory_order_relaxed);
    const std::uint64_t link_bytes = st.timed_bytes.load(std::memory_order_relaxed);
    const std::uint64_t link_ns = st.timed_ns.load(std::memory_order_relaxed);
    const std::uint64_t checksum_errors = ch.checksum_errors.load(std::memory_order_relaxed);
    const std::uint64_t timed_bytes = ch.timed_bytes.load(std::memory_order_relaxed);
    const std::uint64_t timed_ns = ch.timed_ns.load(std::memory_order_relaxed);
    o.checksum_mismatches += checksum_errors - j.checksum_errors;
    o.successes += (ch.sent - j.sent) + (ch.received - j.received);
    o.timeouts += timeouts - j.timeouts;
    t.first += (timed_bytes - j.timed_bytes) + (link_bytes - j.link_timed_bytes);
    t.second += (timed_ns - j.timed_ns) + (link_ns - j.link_timed_ns);
    j = {checksum_errors, ch.sent, ch.received, timed_bytes, timed_ns, timeouts, link_bytes, link_ns};
  };
  // Bytes over time spent in writes: the speed of one write stream, against the transport's.
  auto ratio = [](const std::pair<std::uint64_t, std::uint64_t>& t, double expected_gbps) -> std::optional<double> {
    if (t.first < kBandwidthEvidenceBytes || t.second == 0 || expected_gbps <= 0) return std::nullopt;
    return static_cast<double>(t.first) / static_cast<double>(t.second) / expected_gbps;
  };
  lanes_.for_each([&](LaneState& L) {
    for (std::size_t i = 0; i < L.connections.size(); ++i) judge(*L.connections[i], observations_[i], timed_[i]);
  });
  report_speeds();
  // The device lane's links join their pair's evidence: chunks, timeouts and their own bandwidth
  // (device copies timed with CUDA events, against the device transport's figure); the slower
  // of the two paths judges the pair. Its connections are in lane 0's order (DeviceLane::build).
  if (device_.built())
    for (std::size_t i = 0; i < conns.size(); ++i) {
      Connection& dch = *device_.lane().connections[i];
      std::pair<std::uint64_t, std::uint64_t> t{0, 0};
      auto& o = observations_[i];
      judge(dch, o, t);
      if (const auto r = ratio(t, dch.expected_gbps)) o.bandwidth_ratio = std::min(o.bandwidth_ratio.value_or(*r), *r);
    }
  const auto now = std::chrono::steady_clock::now();
  report_checksum_errors(now, false);
  for (const auto& a : monitor_->evaluate(now, observations_)) {
    if (a.link.b >= ctx_.size) continue;
    if (a.change && a.change->to == health::PolicyState::Suspect)
      emit(HealthEvent{EventKind::LinkSuspect, rank, a.link.a, a.link.b, 0, 0, 0, a.why, 0});
    if (a.change && a.change->to == health::PolicyState::Healthy)
      emit(HealthEvent{EventKind::LinkHealthy, rank, a.link.a, a.link.b, 0, 0, 0, a.why, 0});
    const bool fenced = plan_.is_fenced(a.link.a, a.link.b);
    if (a.state == health::PolicyState::Fenced) {
      if (fenced)
        ballot_.vote(a.link, Vote::Fence);  // still serving its cool-down
      else if (!plan_.is_unroutable(a.link))
        propose(a.link, 0, a.why);
      // An unroutable link (no_plan) stays in use, checked, and its policy keeps judging it
      // fenced: proposing it again at every agreement would log a warning and a fence_proposed
      // event per rank every 64 collectives for the rest of the job (a 2-rank job with a
      // flipping link wrote 12,600 of them in 5 s), and the vote would keep agreements from
      // pacing. The agreement ignores such votes anyway (decide), so none is cast.
    } else if (fenced) {
      ballot_.vote(a.link, Vote::Readmit);  // cool-down served, nothing wrong since: probation in the plan
    }
  }
}

// The first mismatches on a link are reported at once; after that at most one event a
// kChecksumReportInterval with the sum (a link with no route around stays in use, corrupted).
// Counted from the connections' own counters (every lane's link to a peer, the device lane's
// too) against what was reported, not from an agreement's observations: point-to-point calls
// report here as well (`p2p`: also a warning, at most one a kP2PWarningInterval per link), and
// a job that only sends and receives never runs an agreement.
void AgreementRound::report_checksum_errors(std::chrono::steady_clock::time_point now, bool p2p) noexcept {
  const int rank = ctx_.rank;
  const auto& conns = lanes_.main().connections;
  for (std::size_t i = 0; i < conns.size(); ++i) {
    const int peer = conns[i]->peer;
    const auto p = static_cast<std::size_t>(peer);
    const std::uint64_t total = checksum_errors_from(i);
    const std::uint64_t fresh = total > checksum_counted_[p] ? total - checksum_counted_[p] : 0;  // a dropped lane takes its count along
    checksum_counted_[p] = total;
    const LinkId l = LinkId::of(rank, peer);
    if (const std::uint64_t n = checksum_reports_[p].add(fresh, now))
      emit(HealthEvent{EventKind::ChecksumErrors, rank, l.a, l.b, 0, 0, n, {}, 0});
    if (!p2p) continue;
    if (const std::uint64_t n = p2p_warnings_[p].add(fresh, now))
      ctx_.log.warn("link {}-{}: {} chunk{} from rank {} arrived corrupted in point-to-point calls{} and {} re-sent (results stay "
                    "exact); only collectives run fence agreements, so the link stays in use until one does",
                    l.a, l.b, n, n == 1 ? "" : "s", peer, n == fresh ? "" : " since the last warning", n == 1 ? "was" : "were");
  }
}

std::uint64_t AgreementRound::checksum_errors_from(std::size_t i) noexcept {
  std::uint64_t total = 0;
  lanes_.for_each([&](LaneState& L) { total += L.connections[i]->checksum_errors.load(std::memory_order_relaxed); });
  if (device_.built()) total += device_.lane().connections[i]->checksum_errors.load(std::memory_order_relaxed);
  return total;
}

void AgreementRound::report_p2p_checksum_errors() noexcept {
  if (!enabled()) return;
  // Nothing to do, and no clock read, while no chunk arrived damaged and nothing is held back.
  const auto& conns = lanes_.main().connections;
  bool due = false;
  for (std::size_t i = 0; i < conns.size() && !due; ++i) {
    const auto p = static_cast<std::size_t>(conns[i]->peer);
    due = checksum_errors_from(i) != checksum_counted_[p] || checksum_reports_[p].holds() || p2p_warnings_[p].holds();
  }
  if (due) report_checksum_errors(std::chrono::steady_clock::now(), true);
}

// The speed of this rank's writes to each peer since the last agreement (every lane's writes
// to it; the fast end, WriteSpeeds::fast_end), into our row of the ballot; the histograms start
// again. Links are judged on
// these against each other after the allreduce (judge_slowness), not against fixed figures.
void AgreementRound::report_speeds() noexcept {
  const auto& conns = lanes_.main().connections;
  for (std::size_t i = 0; i < conns.size(); ++i) {
    WriteSpeeds merged;
    lanes_.for_each([&](LaneState& L) {
      WriteSpeeds& w = L.connections[i]->speeds;
      for (int b = 0; b < WriteSpeeds::kBuckets; ++b) merged.count[b] += w.count[b];
      merged.writes += w.writes;
      w.clear();
    });
    const int fast = merged.fast_end(kSpeedEvidenceWrites);
    if (fast < 0) continue;
    int transport = 0;
    for (std::size_t t = 0; t < ctx_.transports.size(); ++t)
      if (ctx_.transports[t].get() == conns[i]->transport) transport = static_cast<int>(t);
    ballot_.report_speed(ctx_.rank, conns[i]->peer, fast, transport);
  }
}

std::vector<LinkId> AgreementRound::judge_slowness() {
  std::vector<LinkId> voted;
  const int n = ctx_.size;
  // Per transport: the configured factor, or the transport's natural spread when wider, in
  // quarter-octaves.
  std::vector<int> gaps;
  for (const auto& t : ctx_.transports)
    gaps.push_back(static_cast<int>(std::ceil(4.0 * std::log2(std::max(ctx_.options.health_slow_factor, t->traits().speed_spread)))));
  const SpeedVerdict v = judge_speeds(ballot_, gaps);
  std::vector<std::uint8_t> was = slow_streak_;
  std::fill(slow_streak_.begin(), slow_streak_.end(), std::uint8_t{0});
  for (const SlowLink& s : v.slow) {
    const std::size_t at = static_cast<std::size_t>(s.link.a * n + s.link.b);
    slow_streak_[at] = static_cast<std::uint8_t>(std::min(was[at] + 1, 255));
    // Three agreements in a row: a link slow for a moment (a burst of traffic beside it, a
    // rank moved to another core) is not fenced.
    if (slow_streak_[at] < kSlowStreak || plan_.is_fenced(s.link.a, s.link.b)) continue;
    const std::string why =
        fmt::format("writes from rank {} at {:.3g} GB/s; the job's links on this transport: lower quartile {:.3g} GB/s, median {:.3g} GB/s "
                    "({:.1f}x slower than the lower quartile)",
                    s.writer, WriteSpeeds::gbps_of(s.bucket), WriteSpeeds::gbps_of(s.lower), WriteSpeeds::gbps_of(s.median),
                    WriteSpeeds::gbps_of(s.lower) / WriteSpeeds::gbps_of(s.bucket));
    if (slow_streak_[at] == kSlowStreak) {
      ctx_.log.warn("link {}-{} is slow: {}", s.link.a, s.link.b, why);
      emit(HealthEvent{EventKind::LinkSlow, ctx_.rank, s.link.a, s.link.b, 0, 0, 0, why, 0});
    }
    ledger_.note_reason(s.link, "slow: " + why);
    ballot_.vote(s.link, Vote::Fence);
    voted.push_back(s.link);
  }
  std::vector<std::uint8_t> was_rank = straggler_streak_;
  std::fill(straggler_streak_.begin(), straggler_streak_.end(), std::uint8_t{0});
  for (int r : v.stragglers) {
    const auto at = static_cast<std::size_t>(r);
    straggler_streak_[at] = static_cast<std::uint8_t>(std::min(was_rank[at] + 1, 255));
    if (straggler_streak_[at] != kSlowStreak) continue;  // reported once per episode
    std::string links;
    for (int p = 0; p < n; ++p)
      for (const auto& [from, to] : {std::pair{r, p}, std::pair{p, r}})
        if (p != r && ballot_.speed_of(from, to) >= 0)
          links += fmt::format("{}{}->{} {:.3g} GB/s", links.empty() ? "" : ", ", from, to, WriteSpeeds::gbps_of(ballot_.speed_of(from, to)));
    const std::string why = fmt::format("rank {} is a straggler: its links are slow towards different peers ({}); no link fenced", r, links);
    ctx_.log.warn("{}", why);
    emit(HealthEvent{EventKind::Straggler, ctx_.rank, -1, -1, 0, 0, static_cast<std::uint64_t>(r), why, 0});
  }
  return voted;
}

Status AgreementRound::run(Failure& failure) {
  const int rank = ctx_.rank;
  ++agreements_;
  ballot_.clear();
  report_pace(std::chrono::steady_clock::now());
  if (monitor_) observe();
  ledger_.vote(ballot_);
  // Where each of our links may move instead of being fenced.
  for (int p = 0; p < ctx_.size; ++p)
    if (p != rank) ballot_.offer_fallback(rank, p, mover_.fallback_of(p));
  // An end whose transport cannot resume a fenced link keeps it fenced.
  for (const LinkId& l : plan_.fenced())
    if (l.a == rank || l.b == rank)
      if (!lanes_.main().connection_to(l.a == rank ? l.b : l.a).link->can_reopen()) ballot_.vote(l, Vote::Fence);
  RINGFENCE_TRY(max_allreduce(ballot_.data(), ballot_.bytes(), DataType::Uint8, failure));
  const std::vector<LinkId> slow = judge_slowness();
  pace_next();
  const Decision d = decide(ballot_, plan_, slow);
  ledger_.record(ctx_, d);
  if (!d.moves.empty()) mover_.apply(d.moves, monitor_.get());
  if (!d.moves.empty() || !d.added.empty() || !d.unroutable.empty()) {
    std::vector<LinkId> bad = d.added;
    bad.insert(bad.end(), d.unroutable.begin(), d.unroutable.end());
    for (const auto& m : d.moves) bad.push_back(m.first);
    mover_.move_device_links(bad);
  }
  if (!d.unroutable.empty()) no_route(d);
  if (!d.plan) return Status::ok();
  install(*d.plan, d.fenced, d.added, d.readmitted);
  mover_.move_device_links(d.readmitted, /*home=*/true);
  if (monitor_) {  // a fenced link serves a cool-down before it may come back
    const auto now = std::chrono::steady_clock::now();
    for (const auto& l : d.added) monitor_->fence(l, "fenced by agreement", now);
  }
  const std::string plan = plan_.relays().empty() ? fmt::format("{}", fmt::join(plan_.ring(), "-"))
                                                  : fmt::format("{} relays {}", fmt::join(plan_.ring(), "-"), to_string(plan_.relays()));
  for (const auto& l : d.added) emit(HealthEvent{EventKind::LinkFenced, rank, l.a, l.b, 0, 0, 0, "agreed by all ranks", 0});
  for (const auto& l : d.readmitted)
    emit(HealthEvent{EventKind::LinkReadmitted, rank, l.a, l.b, 0, 0, 0, "cool-down served, counters clean; agreed by all ranks", 0});
  emit(HealthEvent{EventKind::Replanned, rank, -1, -1, 0, 0, 0, plan, 0});
  if (!d.added.empty()) ctx_.log.warn("fenced link {} at collective #{}; epoch {}: ring {}", to_string(d.added), ctx_.seq, plan_.epoch(), plan);
  if (!d.readmitted.empty())
    ctx_.log.warn("readmitted link {} at collective #{}; epoch {}: ring {}", to_string(d.readmitted), ctx_.seq, plan_.epoch(), plan);
  return Status::ok();
}

// No route around: the links stay in use, degraded, with end-to-end checksums on every rank
// from this collective (switched on together: every rank decides from the same votes), so every
// chunk is verified and re-sent when damaged and results stay exact. Failing the job instead
// would stop training on a link that still delivers.
void AgreementRound::no_route(const Decision& d) {
  plan_.add_unroutable(d.unroutable);
  const bool was_checked = lanes_.main().engine.checksum;
  lanes_.for_each([](LaneState& L) { L.engine.checksum = true; });
  const std::string message = fmt::format(
      "links {} must be fenced (agreed by all ranks) but neither a relay nor a ring of {} ranks avoids {}: they stay in use, "
      "degraded, with end-to-end checksums{} (every chunk verified, re-sent when damaged); shrink the communicator or "
      "replace the hardware",
      to_string(d.unroutable), ctx_.size, to_string(d.unplannable), was_checked ? "" : " switched on");
  ctx_.log.error("collective #{}: {}", ctx_.seq, message);
  for (const auto& l : d.unroutable) emit(HealthEvent{EventKind::NoPlan, ctx_.rank, l.a, l.b, 0, 0, 0, message, 0});
}

void AgreementRound::install(Plan next, std::vector<LinkId> fenced, const std::vector<LinkId>& added,
                             const std::vector<LinkId>& readmitted) {
  const int rank = ctx_.rank;
  plan_.set_fenced(std::move(fenced));
  lanes_.for_each([&](LaneState& L) {
    for (const auto& l : added)
      if (l.a == rank || l.b == rank) L.connection_to(l.a == rank ? l.b : l.a).link->fence(FenceReason::HealthPolicy);
    for (const auto& l : readmitted)
      if (l.a == rank || l.b == rank) L.connection_to(l.a == rank ? l.b : l.a).link->reopen();
  });
  set_plan_(std::move(next));
  plan_.bump_epoch();
}

void AgreementRound::install_fences(std::vector<LinkId> all) {
  auto next = plan_around(plan_.ring(), all, ctx_.size);
  if (!next)
    throw LinkFencedError(fmt::format("rank {}: no ring of {} ranks avoids the fenced links {}", ctx_.rank, ctx_.size, to_string(all)),
                          ctx_.rank, all.front().a == ctx_.rank ? all.front().b : all.front().a);
  const std::vector<LinkId> added = all;
  install(std::move(*next), std::move(all), added, {});
}

// The agreement's own allreduce (max, in place) over lane 0, checksummed: the votes and digests
// must not be corrupted on the way. Every element is accepted before it returns: the plan may
// fence a link right after it, and a re-send must not be left for it (RingRunner::finish_call).
// Every rank sends its data to every other in one step where every link is in use and the job
// is small: a ring takes 2 (size - 1) steps, and every agreement slows the collective it
// precedes (at 2 ranks on 2 cores: 2.3 us round the ring, three small allreduces' worth, every
// 64 calls). The same choice on every rank: the plan and the size are the same everywhere.
Status AgreementRound::max_allreduce(void* data, std::size_t count, DataType type, Failure& failure) {
  LaneState& lane0 = lanes_.main();
  EngineConfig config = lane0.engine;
  config.checksum = true;
  config.retained_peers = nullptr;
  const Reducer max = host_reducer(type, ReduceOp::Max);
  const std::size_t bytes = count * size_of(type);
  if (ctx_.size <= kOneShotMaxRanks && lane0.relay_duties.count == 0 && plan_.fenced().empty() && bytes <= sent_.capacity()) {
    sent_.assign(static_cast<const std::uint8_t*>(data), static_cast<const std::uint8_t*>(data) + bytes);  // read while results land
    RingCall call{RingCollective::OneShotAllreduce, sent_.data(), data, count, 0};
    call.by_position = lanes_.by_position();
    call.by_rank = lanes_.by_rank();
    return run_ring(config, lane0.flags, lane0.left, lane0.right, call, max, DirectWrite{}, lane0.relay_duties, failure);
  }
  return run_ring_allreduce(config, lane0.flags, lane0.left, lane0.right, data, data, count, max, DirectWrite{}, lane0.relay_duties,
                            failure);
}

Status AgreementRound::compare_digests(const void* out, std::size_t bytes, Failure& failure, std::string& error) {
  const int rank = ctx_.rank, size = ctx_.size;
  std::fill(digests_.begin(), digests_.end(), std::uint64_t{0});
  digests_[static_cast<std::size_t>(rank)] = (std::uint64_t{1} << 32) | crc32c(out, bytes);  // bit 32: present
  RINGFENCE_TRY(max_allreduce(digests_.data(), digests_.size(), DataType::Uint64, failure));
  const DigestVerdict v = judge_digests(digests_, plan_.ring());  // the same on every rank
  if (v.agree) return Status::ok();
  ++digest_mismatches_;
  std::string all;
  for (int r = 0; r < size; ++r) all += fmt::format("{}{}:{:08x}", r ? " " : "", r, digests_[static_cast<std::size_t>(r)] & 0xffffffffu);
  std::string blamed;
  if (v.majority) {
    for (int r : v.ranks) {
      blamed += fmt::format("{}rank {}", blamed.empty() ? "" : ", ", r);
      emit(HealthEvent{EventKind::DigestMismatch, rank, -1, -1, 0, 0, static_cast<std::uint64_t>(r), all, 0});
    }
    blamed += " (differing from the majority)";
  } else {
    blamed = "no rank (no strict majority agrees)";
    for (const auto& l : v.links) emit(HealthEvent{EventKind::DigestMismatch, rank, l.a, l.b, 0, 0, kDigestNoRank, all, 0});
  }
  if (!v.links.empty()) blamed += "; outputs differ across ring link(s) " + to_string(v.links) + " (a value damaged on a hop differs from there on)";
  const std::string message = fmt::format("collective #{}: result digests differ (rank:crc32c {}): blamed {}", ctx_.seq, all, blamed);
  switch (ctx_.options.digest_action) {
    case DigestAction::Log: ctx_.log.error("{}", message); break;
    case DigestAction::Error: error = message; break;
    case DigestAction::Fence: {
      ctx_.log.error("{}; fencing the link(s)", message);
      std::vector<LinkId> fenced = plan_.fenced(), added;
      for (const auto& l : v.links)
        if (std::find(fenced.begin(), fenced.end(), l) == fenced.end()) fenced.push_back(l), added.push_back(l);
      if (added.empty()) break;
      auto next = plan_around(plan_.ring(), fenced, size);
      if (!next) {
        error = message + "; no ring avoids those links, so they cannot be fenced";
        break;
      }
      for (const auto& l : added) emit(HealthEvent{EventKind::LinkFenced, rank, l.a, l.b, 0, 0, 0, "result digests disagree over it", 0});
      install(std::move(*next), std::move(fenced), added, {});
      break;
    }
  }
  return Status::ok();
}

}  // namespace ringfence::detail
