/// ringfence-health: the health of a job's links, like `nvidia-smi nvlink -e` / `dcgmi health -c`.
///
///   ringfence-health [--events] [--json] LOGFILE|-
///       summarises a health-event log (RINGFENCE_HEALTH_LOG, JSON lines) per link: state (ok /
///       suspect / moved / fenced / no-plan), corrupted chunks, fence proposals, the collective
///       at which the link was fenced, the last reason; then the re-plans. `--events` also
///       prints every event.
///   ringfence-health --live DIR [--interval S] [--count N] [--json]
///       a running job's per-link table (GB/s, state, CRC errors, re-sends, wait), from the
///       Prometheus files its ranks refresh in DIR (RINGFENCE_HEALTH_PROMETHEUS=DIR/x-{rank}.prom),
///       every S seconds (1), N times (0: until interrupted).
///   ringfence-health --plot LOGFILE OUT.png
///       each link's state over time from a health-event log (gnuplot), with fence, readmit,
///       move, slow and corrupted-chunk marks.
///   ringfence-health ledger [--ledger PATH] list [--all] [--json] | clear LINK | export --json
///       the health ledger (RINGFENCE_HEALTH_LEDGER): fences, moves and readmissions that
///       outlive the job; `list` exits 2 while some link is in quarantine.
///
/// `--json` prints one JSON object per summary or reading instead of tables. Exit status, in
/// every mode: 0 healthy, 1 suspect, 2 fenced, 3 no data (no file, no event, no link), 4 usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "health_ledger_cli.hpp"
#include "health_live.hpp"
#include "health_plot.hpp"
#include "health_log.hpp"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: ringfence-health [--events] [--json] LOGFILE|-\n"
               "       ringfence-health --live DIR [--interval S] [--count N] [--json]\n"
               "       ringfence-health --plot LOGFILE OUT.png\n"
               "       ringfence-health ledger [--ledger PATH] list [--all] [--json] | clear LINK | export --json\n"
               "exit status: 0 healthy, 1 suspect, 2 fenced, 3 no data, 4 usage\n");
  return ringfence::tools::kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ringfence::tools;
  if (argc > 1 && std::string(argv[1]) == "ledger") return run_ledger(std::vector<std::string>(argv + 2, argv + argc));
  if (argc > 1 && std::string(argv[1]) == "--plot") {
    if (argc != 4) return usage();
    return plot_health_log(argv[2], argv[3]);  // 0, 3 without events, 1 when gnuplot fails
  }
  bool show_events = false, json = false;
  std::string path;
  LiveOptions live;
  bool is_live = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--events") {
      show_events = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--live") {
      const char* v = value();
      if (!v) return usage();
      is_live = true;
      live.dir = v;
    } else if (arg == "--interval" || arg == "--count") {
      const char* v = value();
      char* end = nullptr;
      const double x = v ? std::strtod(v, &end) : -1;
      if (!v || *end != '\0' || x < 0 || (arg == "--interval" && x <= 0)) {
        std::fprintf(stderr, "ringfence-health: %s '%s': expected a %s number\n", arg.c_str(), v ? v : "",
                     arg == "--interval" ? "positive" : "non-negative whole");
        return usage();
      }
      if (arg == "--interval") live.interval_s = x;
      else live.count = static_cast<int>(x);
    } else if (arg == "-h" || arg == "--help" || (arg.size() > 1 && arg[0] == '-' && arg != "-")) {
      return usage();
    } else if (path.empty()) {
      path = arg;
    } else {
      return usage();
    }
  }
  if (is_live) {
    if (!path.empty() || show_events) return usage();
    live.json = json;
    return static_cast<int>(run_live(live));
  }
  if (path.empty()) return usage();
  if (path == "-") return static_cast<int>(summarize_log(std::cin, "-", show_events, json));
  std::ifstream file(path);
  if (!file) {
    std::fprintf(stderr, "ringfence-health: cannot open '%s'\n", path.c_str());
    return static_cast<int>(Verdict::NoData);
  }
  return static_cast<int>(summarize_log(file, path, show_events, json));
}
