#pragma once
// ringfence-health ledger: the health ledger (RINGFENCE_HEALTH_LEDGER, src/health/ledger.hpp)
// for operators: what is quarantined, clearing a link, exporting every entry.
#include <string>
#include <vector>

namespace ringfence::tools {

/// `args` after "ledger": [--ledger PATH] list [--all] [--json] | clear LINK | export --json.
/// PATH defaults to RINGFENCE_HEALTH_LEDGER. Returns the exit status: list: 2 when a link is
/// in quarantine, 0 when none, 3 when the ledger has no entry; clear/export: 0, 3 when nothing
/// matched; 4 on usage errors; 1 when the ledger cannot be read or written.
int run_ledger(const std::vector<std::string>& args);

}  // namespace ringfence::tools
