#pragma once
// ringfence-health --plot LOG OUT.png: a health-event log (RINGFENCE_HEALTH_LOG, JSON lines)
// drawn as each link's state over time, with gnuplot.
#include <string>

namespace ringfence::tools {

/// Draws the health-event log `log_path` (one JSON event per line, as the library writes it)
/// into the PNG `png_path` with gnuplot (pngcairo where it has it, else png): one row per link
/// "a-b", a bar coloured by the link's state over time (ok, suspect, slow, fenced, moved; x =
/// time since the first event, in s, ms or us as the log's span needs), marks above the bar
/// for evidence (checksum_errors, labelled with the corrupted chunks per collective; link_slow)
/// and below it for agreed decisions (link_fenced, link_readmitted, link_moved). An event every
/// rank reports is drawn once. Lines that are not events are skipped.
/// Returns 0 when the PNG was written, 3 when the log cannot be read or holds no event, 1 when
/// gnuplot is missing or fails; 3 and 1 print one line naming the file on stderr.
int plot_health_log(const std::string& log_path, const std::string& png_path);

}  // namespace ringfence::tools
