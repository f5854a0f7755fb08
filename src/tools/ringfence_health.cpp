/// ringfence-health: summarises a health-event log (RINGFENCE_HEALTH_LOG, JSON lines) as a
/// per-link table, like `nvidia-smi nvlink -e` / `dcgmi health -c`.
///
///   ringfence-health [--events] LOGFILE|-
///
/// Columns: link, state (ok / suspect / moved / fenced / no-plan), corrupted chunks reported, fence
/// proposals, collective at which the link was fenced, last reason. Then the re-plans.
/// `--events` also prints every event. Exit status: 0, or 2 for usage errors, 1 when the file
/// cannot be read or holds no event.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <ringfence/events.hpp>
#include <set>
#include <string>
#include <vector>

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
};

int usage() {
  std::fprintf(stderr, "usage: ringfence-health [--events] LOGFILE|-\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool show_events = false;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--events") show_events = true;
    else if (arg == "-h" || arg == "--help") return usage();
    else if (path.empty()) path = arg;
    else return usage();
  }
  if (path.empty()) return usage();
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) {
      std::fprintf(stderr, "ringfence-health: cannot open '%s'\n", path.c_str());
      return 1;
    }
  }
  std::istream& in = path == "-" ? std::cin : file;
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
    if (show_events) std::printf("%s\n", line.c_str());
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
    std::fprintf(stderr, "ringfence-health: no events in '%s'%s\n", path.c_str(), malformed ? " (only malformed lines)" : "");
    return 1;
  }
  std::printf("ringfence-health: %zu events from %zu ranks%s\n", events, ranks.size(),
              malformed ? (", " + std::to_string(malformed) + " malformed lines skipped").c_str() : "");
  std::printf("%7s %9s %16s %10s %10s  %s\n", "link", "state", "crc-errors", "proposals", "fenced-at", "reason");
  for (const auto& [id, l] : links) {
    const char* state = l.no_plan ? "no-plan" : l.fenced ? "fenced" : l.moves ? "moved" : (l.suspect || l.checksum_errors || l.slow) ? "suspect" : "ok";
    const std::string name = std::to_string(id.first) + "-" + std::to_string(id.second);
    const std::string at = l.fenced ? "#" + std::to_string(l.fenced_at) : "-";
    std::printf("%7s %9s %16llu %10d %10s  %s\n", name.c_str(), state, static_cast<unsigned long long>(l.checksum_errors),
                l.proposals, at.c_str(), l.reason.c_str());
  }
  for (const auto& [epoch, r] : replans)
    std::printf("epoch %llu from collective #%llu: ring %s\n", static_cast<unsigned long long>(epoch),
                static_cast<unsigned long long>(r.first), r.second.c_str());
  for (const auto& d : digest_mismatches) std::printf("digest mismatch at %s\n", d.c_str());
  for (const auto& s : stragglers) std::printf("straggler %s\n", s.c_str());
  return 0;
}
