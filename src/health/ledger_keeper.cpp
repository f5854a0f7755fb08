// LedgerKeeper (ledger_keeper.hpp): the health ledger inside the fence agreement.
#include "ledger_keeper.hpp"

#include <unistd.h>

#include <algorithm>

#include "ledger.hpp"

namespace ringfence::detail {

void LedgerKeeper::load(const CommContext& ctx) {
  const std::string& path = ctx.options.health_ledger;
  if (path.empty() || ctx.size < 2) return;
  ids_ = endpoint_identities(ctx.peer_info);
  LedgerRead read;
  try {
    read = read_ledger(path);
  } catch (const std::exception& e) {
    ctx.log.warn("health ledger not used: {}", e.what());
    return;
  }
  if (read.skipped > 0 && ctx.rank == 0)
    ctx.log.warn("health ledger '{}': {} torn or unreadable lines skipped", path, read.skipped);
  const double now = unix_now();
  for (const auto& [ends, e] : latest_by_link(read.entries)) {
    const double left = quarantine_left(e, now);
    if (left <= 0) continue;
    const auto a = std::find(ids_.begin(), ids_.end(), ends.first), b = std::find(ids_.begin(), ids_.end(), ends.second);
    if (a == ids_.end() || b == ids_.end() || a == b) continue;  // not a link of this job
    const LinkId l = LinkId::of(static_cast<int>(a - ids_.begin()), static_cast<int>(b - ids_.begin()));
    quarantined_.push_back(Quarantine{l, e.time + e.quarantine_s});
    if (ctx.rank == 0)
      ctx.log.warn("health ledger: link {}-{} ({} <-> {}) was {} by an earlier job ({}); quarantined for {:.0f} s more: fenced from collective #1",
                   l.a, l.b, ends.first, ends.second, e.action, e.evidence, left);
  }
  pending_ = !quarantined_.empty();
}

void LedgerKeeper::vote(Ballot& ballot) {
  pending_ = false;
  if (quarantined_.empty()) return;
  const double now = unix_now();
  std::erase_if(quarantined_, [&](const Quarantine& q) { return q.until <= now; });
  for (const auto& q : quarantined_) ballot.vote(q.link, Vote::Fence);
}

void LedgerKeeper::append(const CommContext& ctx, LinkId l, const char* action, std::string evidence) noexcept {
  try {
    LedgerEntry e;
    e.time = unix_now();
    e.action = action;
    e.a = ids_[static_cast<std::size_t>(l.a)];
    e.b = ids_[static_cast<std::size_t>(l.b)];
    if (e.b < e.a) std::swap(e.a, e.b);
    e.link = fmt::format("{}-{}", l.a, l.b);
    e.evidence = std::move(evidence);
    e.quarantine_s = static_cast<double>(ctx.options.health_ledger_quarantine.count());
    e.writer = fmt::format("{}:{}", ctx.self.host_id, ::getpid());
    append_ledger(ctx.options.health_ledger, e);
  } catch (const std::exception& ex) {
    ctx.log.warn("health ledger: {}", ex.what());
  }
}

void LedgerKeeper::record(const CommContext& ctx, const Decision& d) {
  if (ctx.options.health_ledger.empty() || ids_.empty()) return;
  const int rank = ctx.rank;
  auto mine = [&](LinkId l) { return l.a == rank || l.b == rank; };
  auto quarantined = [&](LinkId l) {
    return std::any_of(quarantined_.begin(), quarantined_.end(), [&](const Quarantine& q) { return q.link == l; });
  };
  auto fence_like = [&](LinkId l, const char* action, const std::string& how) {
    if (!mine(l)) return;
    const auto it = reasons_.find(l);
    if (it != reasons_.end()) append(ctx, l, action, it->second + how);
    else if (l.a == rank && !quarantined(l)) append(ctx, l, action, std::string(kAgreedElsewhere) + how);
  };
  for (const auto& l : d.added) fence_like(l, "fenced", "");
  for (const auto& [l, transport] : d.moves)
    fence_like(l, "moved", fmt::format(" (moved to {})", ctx.transports.size() > static_cast<std::size_t>(transport)
                                                              ? ctx.transports[static_cast<std::size_t>(transport)]->name()
                                                              : std::to_string(transport)));
  for (const auto& l : d.readmitted)
    if (l.a == rank) append(ctx, l, "readmitted", "cool-down served, counters clean; agreed by all ranks");
  reasons_.clear();
}

}  // namespace ringfence::detail
