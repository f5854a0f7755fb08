#pragma once
// The health ledger (RINGFENCE_HEALTH_LEDGER, docs/health.md "Health ledger"): a file that
// outlives the job, on shared storage or per node, where every fence, move and readmission is
// appended as one JSON line naming the link by what it is (host and GPU, or host and the rank's
// place on it) rather than by rank numbers, which change from job to job. A job reads it at
// init and starts with the links still in quarantine fenced, so a known-bad link is never used
// first. Writers only append (one write per line under an exclusive flock), so jobs on several
// nodes may share it; a torn or foreign line is skipped when read.
#include <cstddef>
#include <map>
#include <optional>
#include <ringfence/transport.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringfence::detail {

/// The evidence an end writes when another rank proposed the fence.
inline constexpr std::string_view kAgreedElsewhere = "agreed by all ranks (proposed by another rank)";

/// One line of the ledger.
struct LedgerEntry {
  double time = 0;          ///< unix seconds
  std::string action;       ///< "fenced", "moved", "readmitted" or "cleared"
  std::string a, b;         ///< the link's ends (endpoint identities), a < b
  std::string link;         ///< the link as the writing job's ranks ("1-2"), for people
  std::string evidence;     ///< why (the policy's reason, the slow-link figures, ...)
  double quarantine_s = 0;  ///< fenced or moved: how long later jobs keep it fenced
  std::string writer;       ///< host:pid of the writing rank
};

/// One JSON object, no newline.
std::string to_json(const LedgerEntry& e);
/// The entry on `line`, or nullopt for anything else (never throws).
std::optional<LedgerEntry> parse_ledger_line(std::string_view line) noexcept;

struct LedgerRead {
  std::vector<LedgerEntry> entries;  ///< in file order
  std::size_t skipped = 0;           ///< torn or foreign lines
};
/// Every entry of the ledger at `path` (none when it does not exist). Throws SystemError when
/// it exists but cannot be read.
LedgerRead read_ledger(const std::string& path);
/// Appends `e` as one line: one write(2) under an exclusive flock, so concurrent writers from
/// any number of processes never interleave. Throws SystemError naming the path.
void append_ledger(const std::string& path, const LedgerEntry& e);

/// Lines of one action on one link this close in time are one decision (its two ends' lines).
inline constexpr double kSameDecisionSeconds = 60;

/// The latest entry of every link (keyed by its two ends). Of the two lines of one decision the
/// one with evidence is kept (with the later time), whichever was written first.
std::map<std::pair<std::string, std::string>, LedgerEntry> latest_by_link(const std::vector<LedgerEntry>& entries);
/// Seconds of quarantine `e` has left at `now` (unix seconds): > 0 only for fenced and moved.
double quarantine_left(const LedgerEntry& e, double now) noexcept;

/// Each rank's endpoint identity: `host/gpu:BUS` when its GPU is known, else
/// `host/rank-on-host:K` (its place among the ranks of its host, by rank), which names the same
/// slot from job to job when jobs are laid out alike.
std::vector<std::string> endpoint_identities(const std::vector<PeerInfo>& peers);

/// Unix seconds now.
double unix_now() noexcept;

}  // namespace ringfence::detail
