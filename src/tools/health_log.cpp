// ringfence-health LOG (health_log.hpp): the per-link summary of a health-event log.
#include "health_log.hpp"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <ringfence/events.hpp>
#include <set>
#include <vector>

namespace ringfence::tools {

namespace {

struct LinkSummary {
  std::uint64_t checksum_errors = 0;
  int proposals = 0;
  int moves = 0;  // moved to another transport instead of fenced
  bool fenced = false;
  bool suspect = false;
  bool no_plan = false;
  bool slow = false;  // link_slow: judged far slower than the median link
  std::uint64_t fenced_at = 0;
  std::string reason;

  const char* state() const noexcept {
    return no_plan ? "no-plan" : fenced ? "fenced" : moves ? "moved" : (suspect || checksum_errors || slow) ? "suspect" : "ok";
  }
  Verdict verdict() const noexcept {
    return no_plan || fenced ? Verdict::Fenced : std::string_view(state()) == "ok" ? Verdict::Healthy : Verdict::Suspect;
  }
};

}  // namespace

Verdict summarize_log(std::istream& in, const std::string& name, bool show_events, bool json) {
  std::map<std::pair<int, int>, LinkSummary> links;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::string>> replans;  // epoch -> (seq, ring)
  std::set<int> ranks;
  std::vector<std::string> digest_mismatches;
  std::set<std::string> stragglers;
  std::size_t events = 0, malformed = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto e = ringfence::parse_event_json(line);
    if (!e) {
      ++malformed;
      continue;
    }
    ++events;
    ranks.insert(e->rank);
    if (show_events && !json) std::printf("%s\n", line.c_str());
    if (e->kind == ringfence::EventKind::DigestMismatch) {
      const std::string who = e->count == ringfence::kDigestNoRank
                                  ? "no majority; outputs disagree over link " + std::to_string(e->a) + "-" + std::to_string(e->b)
                                  : "rank " + std::to_string(e->count) + " diverged";
      digest_mismatches.push_back("collective #" + std::to_string(e->sequence) + ": " + who + " (" + e->detail + ")");
      continue;
    }
    if (e->kind == ringfence::EventKind::Straggler) {
      stragglers.insert("rank " + std::to_string(e->count) + " at collective #" + std::to_string(e->sequence) + ": " + e->detail);
      continue;
    }
    if (e->kind == ringfence::EventKind::Replanned) {
      replans[e->epoch] = {e->sequence, e->detail};
      continue;
    }
    if (e->a < 0) continue;
    LinkSummary& l = links[{e->a, e->b}];
    switch (e->kind) {
      case ringfence::EventKind::ChecksumErrors: l.checksum_errors += e->count; break;
      case ringfence::EventKind::FenceProposed:
        ++l.proposals;
        l.reason = e->detail;
        break;
      case ringfence::EventKind::LinkFenced:
        l.fenced = true;
        l.fenced_at = e->sequence;
        break;
      case ringfence::EventKind::LinkReadmitted:
        l.fenced = false;
        l.reason = "readmitted at collective #" + std::to_string(e->sequence) + " (cool-down served, counters clean)";
        break;
      case ringfence::EventKind::LinkSuspect:
        l.suspect = true;
        if (!l.fenced) l.reason = e->detail;
        break;
      case ringfence::EventKind::LinkHealthy:
        l.suspect = false;
        if (!l.fenced) l.reason = e->detail;
        break;
      case ringfence::EventKind::LinkMoved:
        ++l.moves;
        l.suspect = false;
        l.reason = "moved " + e->detail + " at collective #" + std::to_string(e->sequence);
        break;
      case ringfence::EventKind::NoPlan:
        l.no_plan = true;
        l.reason = "neither a relay nor a ring avoids the fenced links";
        break;
      case ringfence::EventKind::LinkSlow:
        l.slow = true;
        l.reason = "slow: " + e->detail;
        break;
      case ringfence::EventKind::Replanned:
      case ringfence::EventKind::Straggler:
      case ringfence::EventKind::DigestMismatch: break;
    }
  }
  if (events == 0) {
    std::fprintf(stderr, "ringfence-health: no events in '%s'%s\n", name.c_str(), malformed ? " (only malformed lines)" : "");
    if (json) std::printf("%s\n", nlohmann::json{{"verdict", to_string(Verdict::NoData)}, {"events", 0}, {"malformed", malformed}}.dump().c_str());
    return Verdict::NoData;
  }
  Verdict verdict = Verdict::Healthy;
  for (const auto& [id, l] : links) verdict = worse(verdict, l.verdict());
  if (!digest_mismatches.empty() || !stragglers.empty()) verdict = worse(verdict, Verdict::Suspect);
  if (json) {
    nlohmann::json out{{"verdict", to_string(verdict)}, {"events", events}, {"ranks", ranks.size()}, {"malformed", malformed}};
    nlohmann::json& jl = out["links"] = nlohmann::json::array();
    for (const auto& [id, l] : links)
      jl.push_back({{"link", std::to_string(id.first) + "-" + std::to_string(id.second)},
                    {"state", l.state()},
                    {"checksum_errors", l.checksum_errors},
                    {"proposals", l.proposals},
                    {"fenced_at", l.fenced ? nlohmann::json(l.fenced_at) : nlohmann::json(nullptr)},
                    {"reason", l.reason}});
    nlohmann::json& jr = out["replans"] = nlohmann::json::array();
    for (const auto& [epoch, r] : replans) jr.push_back({{"epoch", epoch}, {"seq", r.first}, {"ring", r.second}});
    out["digest_mismatches"] = digest_mismatches;
    out["stragglers"] = stragglers;
    std::printf("%s\n", out.dump().c_str());
    return verdict;
  }
  std::printf("ringfence-health: %zu events from %zu ranks%s\n", events, ranks.size(),
              malformed ? (", " + std::to_string(malformed) + " malformed lines skipped").c_str() : "");
  std::printf("%7s %9s %16s %10s %10s  %s\n", "link", "state", "crc-errors", "proposals", "fenced-at", "reason");
  for (const auto& [id, l] : links) {
    const std::string link = std::to_string(id.first) + "-" + std::to_string(id.second);
    const std::string at = l.fenced ? "#" + std::to_string(l.fenced_at) : "-";
    std::printf("%7s %9s %16llu %10d %10s  %s\n", link.c_str(), l.state(), static_cast<unsigned long long>(l.checksum_errors),
                l.proposals, at.c_str(), l.reason.c_str());
  }
  for (const auto& [epoch, r] : replans)
    std::printf("epoch %llu from collective #%llu: ring %s\n", static_cast<unsigned long long>(epoch),
                static_cast<unsigned long long>(r.first), r.second.c_str());
  for (const auto& d : digest_mismatches) std::printf("digest mismatch at %s\n", d.c_str());
  for (const auto& s : stragglers) std::printf("straggler %s\n", s.c_str());
  return verdict;
}

}  // namespace ringfence::tools
