#pragma once
// ringfence-health LOG: a health-event log (RINGFENCE_HEALTH_LOG, JSON lines) summarised per
// link, as a table or as JSON.
#include <istream>
#include <string>

#include "health_verdict.hpp"

namespace ringfence::tools {

/// Reads every event of `in` (named `name` in messages), prints the summary (or, with `json`,
/// one JSON object; with `show_events` also every event line first, text mode only) and returns
/// the verdict: NoData when the log holds no event.
Verdict summarize_log(std::istream& in, const std::string& name, bool show_events, bool json);

}  // namespace ringfence::tools
