#include "link_mover.hpp"

#include <ringfence/error.hpp>
#include <thread>

namespace ringfence::detail {

// A moved connection is judged against its new transport's figure, its link's own counters from zero.
void LinkMover::judge_afresh(Connection& ch, Transport& to) const {
  ch.expected_gbps = to.can_reach(ctx_.self, ctx_.peer(ch.peer)).bandwidth_gbps;
  ch.judged.timeouts = ch.judged.link_timed_bytes = ch.judged.link_timed_ns = 0;
}

void LinkMover::start() {
  fallback_of_.assign(static_cast<std::size_t>(ctx_.size), -1);
  for (auto& ch : lanes_.main().connections) fallback_of_[static_cast<std::size_t>(ch->peer)] = fallback_for(*ch);
}

int LinkMover::fallback_for(const Connection& ch) const {
  if (ctx_.store->collective_only()) return -1;  // a move needs the two ends to use the store alone
  for (const auto& [from, to] : ctx_.fallbacks) {
    if (from != ch.transport_name) continue;
    for (std::size_t t = 0; t < ctx_.transports.size(); ++t)
      if (ctx_.transports[t]->name() == to && ctx_.transports[t].get() != ch.transport &&
          ctx_.transports[t]->can_reach(ctx_.self, ctx_.peer(ch.peer)).ok)
        return static_cast<int>(t);
  }
  return -1;
}

// The two ends of a move meet in the store under `base`; meanwhile `drive()` keeps polling the
// old links: a signal a transport delivers only through the sender's progress (nvlink behind
// copies) may be what the peer still waits for. `what` names the link in the timeout error.
template <class Drive>
void LinkMover::meet(const std::string& base, int peer, Transport& to, const char* what, Drive drive) {
  const std::string ready = base + "/ready";
  Store& store = *ctx_.store;
  (void)store.add(ready, 1);
  for (const auto start = std::chrono::steady_clock::now(); store.add(ready, 0) < 2;) {
    drive();
    if (std::chrono::steady_clock::now() - start > ctx_.options.timeout)
      throw TimeoutError(fmt::format("rank {}: moving {} to rank {} to {}: rank {} did not come to the move within {} ms", ctx_.rank,
                                     what, peer, to.name(), peer, ctx_.options.timeout.count()));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Moves our links to `peer` (every lane; the heartbeat's stays) to `to`. The two ends meet once
// both finished the agreement, driving the old links while they wait. The agreement's allreduce
// ends on each rank only once every chunk it sent was credited and every chunk it needed
// arrived, so when both ends are there nothing either needs is in flight between them (a
// call-fingerprint acknowledgement may be, and a later one supersedes it: they count up). Each
// end then closes its old links, connects new ones as at setup (store keys unique to this
// collective) and registers the same flags and staging memory.
void LinkMover::move_link(int peer, Transport& to) {
  const LinkId l = LinkId::of(ctx_.rank, peer);
  const std::string base = fmt::format("move/{}/{}-{}", ctx_.seq, l.a, l.b);
  meet(base, peer, to, "the link", [&] { lanes_.for_each([&](LaneState& L) { poll_link(L.connection_to(peer)); }); });
  regs_.clear_remote();  // cached keys were made for the old transport
  regs_.clear_local();
  int index = 0;
  const std::string what = fmt::format("rank {}: moving the link to rank {} to {}: connecting", ctx_.rank, peer, to.name());
  lanes_.for_each([&](LaneState& L) {
    Connection& ch = L.connection_to(peer);
    lanes_.connect_connection(L, ch, to, fmt::format("{}/lane{}", base, index++), MemoryKind::Host, what);
    judge_afresh(ch, to);
  });
  fallback_of_[static_cast<std::size_t>(peer)] = fallback_for(lanes_.main().connection_to(peer));
}

// As move_link, for the device lane alone, its staging slots registered anew as device memory.
// Nothing of a device-lane call is in flight at an agreement (each ends only once its links are
// idle: copies landed, signals stored), and the old link is polled until both ends meet.
void LinkMover::move_device_link(int peer, Transport& to) {
  LaneState& L = device_.lane();
  Connection& ch = L.connection_to(peer);
  const LinkId l = LinkId::of(ctx_.rank, peer);
  const std::string base = fmt::format("move/{}/{}-{}/device", ctx_.seq, l.a, l.b);
  // The new link's streams and events belong to the lane's GPU (this may be any thread).
  device_.make_current(fmt::format("moving the device lane's link to rank {}", peer));
  meet(base, peer, to, "the device lane's link", [&] { poll_link(ch); });
  lanes_.connect_connection(L, ch, to, base, MemoryKind::Device,
                            fmt::format("rank {}: moving the device lane's link to rank {} to {}: connecting", ctx_.rank, peer, to.name()));
  judge_afresh(ch, to);
}

void LinkMover::move_device_links(const std::vector<LinkId>& links, bool home) {
  if (!device_.built()) return;
  for (const LinkId& l : links) {
    if (l.a != ctx_.rank && l.b != ctx_.rank) continue;
    const int peer = l.a == ctx_.rank ? l.b : l.a;
    Connection& ch = device_.lane().connection_to(peer);
    Transport* to = home ? device_.transport(peer) : device_.fallback(ch.transport_name, peer);
    if (!to || to->name() == ch.transport_name) continue;
    const std::string detail = fmt::format("device lane: {}to {} (was {})", home ? "back " : "", to->name(), ch.transport_name);
    try {
      move_device_link(peer, *to);
    } catch (const Error& e) {
      failure_.fail(Status(e.code()), e.what(), peer);
      throw;
    }
    ctx_.log.warn("link {}-{} moved on the device lane at collective #{}: {}", l.a, l.b, ctx_.seq, detail);
    emit(HealthEvent{EventKind::LinkMoved, ctx_.rank, l.a, l.b, 0, 0, 0, detail, 0});
  }
}

void LinkMover::apply(const std::vector<std::pair<LinkId, int>>& moves, HealthMonitor* monitor) {
  for (const auto& [l, t] : moves) {
    Transport& to = *ctx_.transports[static_cast<std::size_t>(t)];
    std::string detail = fmt::format("to {}", to.name());
    if (l.a == ctx_.rank || l.b == ctx_.rank) {
      const int peer = l.a == ctx_.rank ? l.b : l.a;
      detail += fmt::format(" (was {})", lanes_.main().connection_to(peer).transport_name);
      try {
        move_link(peer, to);
      } catch (const Error& e) {
        failure_.fail(Status(e.code()), e.what(), peer);  // the other ranks learn it at once instead of timing out
        throw;
      }
    }
    if (monitor) monitor->moved(l);
    plan_.note_moved(l);
    ctx_.log.warn("link {}-{} moved {} at collective #{}: agreed by all ranks; the plan is unchanged", l.a, l.b, detail, ctx_.seq);
    emit(HealthEvent{EventKind::LinkMoved, ctx_.rank, l.a, l.b, 0, 0, 0, detail, 0});
  }
  plan_.bump_epoch();
}

}  // namespace ringfence::detail
