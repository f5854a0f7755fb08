// ringfence-health ledger (health_ledger_cli.hpp).
#include "health_ledger_cli.hpp"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <ringfence/env.hpp>

#include "../health/ledger.hpp"
#include "health_verdict.hpp"

namespace ringfence::tools {

namespace {

using detail::LedgerEntry;

int usage(const char* why) {
  std::fprintf(stderr,
               "ringfence-health ledger: %s\n"
               "usage: ringfence-health ledger [--ledger PATH] list [--all] [--json]\n"
               "       ringfence-health ledger [--ledger PATH] clear LINK     (LINK: \"1-2\" as a job named it, or \"END,END\")\n"
               "       ringfence-health ledger [--ledger PATH] export --json\n"
               "PATH defaults to RINGFENCE_HEALTH_LEDGER\n",
               why);
  return kUsageError;
}

nlohmann::json as_json(const LedgerEntry& e, double now) {
  return {{"time", e.time},         {"action", e.action},     {"a", e.a},           {"b", e.b},
          {"link", e.link},         {"evidence", e.evidence}, {"writer", e.writer}, {"quarantine_s", e.quarantine_s},
          {"quarantine_left_s", std::max(0.0, detail::quarantine_left(e, now))}};
}

std::string when(double unix_time) {
  const auto t = static_cast<time_t>(unix_time);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int run_ledger(const std::vector<std::string>& args) {
  std::string path, command, link;
  bool all = false, json = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--ledger") {
      if (++i >= args.size()) return usage("--ledger needs a path");
      path = args[i];
    } else if (a == "--all") {
      all = true;
    } else if (a == "--json") {
      json = true;
    } else if (command.empty() && (a == "list" || a == "clear" || a == "export")) {
      command = a;
    } else if (command == "clear" && link.empty()) {
      link = a;
    } else {
      return usage(("unexpected argument '" + a + "'").c_str());
    }
  }
  if (path.empty()) path = Environment::from_process().get("RINGFENCE_HEALTH_LEDGER").value_or("");
  if (path.empty()) return usage("no ledger: give --ledger PATH or set RINGFENCE_HEALTH_LEDGER");
  if (command.empty()) return usage("say list, clear LINK or export --json");
  if (command == "clear" && link.empty()) return usage("clear needs a LINK");
  if (command == "export" && !json) return usage("export writes JSON: add --json");
  detail::LedgerRead read;
  try {
    read = detail::read_ledger(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringfence-health ledger: %s\n", e.what());
    return 1;
  }
  if (read.skipped) std::fprintf(stderr, "ringfence-health ledger: %zu torn or unreadable lines in '%s' skipped\n", read.skipped, path.c_str());
  const double now = detail::unix_now();
  const auto latest = detail::latest_by_link(read.entries);
  if (command == "export") {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : read.entries) out.push_back(as_json(e, now));
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return read.entries.empty() ? static_cast<int>(Verdict::NoData) : 0;
  }
  if (command == "clear") {
    int cleared = 0;
    for (const auto& [ends, e] : latest) {
      const bool match = e.link == link || link == ends.first + "," + ends.second || link == ends.second + "," + ends.first;
      if (!match || e.action == "cleared") continue;
      LedgerEntry c = e;
      c.time = now;
      c.action = "cleared";
      c.evidence = "cleared by ringfence-health ledger clear";
      c.quarantine_s = 0;
      char host[256] = "";
      ::gethostname(host, sizeof host - 1);
      c.writer = std::string(host) + ":" + std::to_string(::getpid());
      try {
        detail::append_ledger(path, c);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "ringfence-health ledger: %s\n", ex.what());
        return 1;
      }
      std::printf("cleared %s (%s <-> %s)\n", e.link.c_str(), ends.first.c_str(), ends.second.c_str());
      ++cleared;
    }
    if (cleared == 0) std::fprintf(stderr, "ringfence-health ledger: no entry for link '%s' in '%s'\n", link.c_str(), path.c_str());
    return cleared ? 0 : static_cast<int>(Verdict::NoData);
  }
  // list: the latest entry of every link (or every entry with --all).
  bool any_quarantined = false;
  nlohmann::json out = nlohmann::json::array();
  if (!json) std::printf("%-6s %-11s %-21s %12s  %-50s  %s\n", "link", "action", "time", "quarantine", "ends", "evidence");
  auto show = [&](const LedgerEntry& e) {
    const double left = detail::quarantine_left(e, now);
    any_quarantined = any_quarantined || left > 0;
    if (json) {
      out.push_back(as_json(e, now));
      return;
    }
    const std::string q = left > 0 ? std::to_string(static_cast<long long>(left)) + " s left" : "-";
    std::printf("%-6s %-11s %-21s %12s  %-50s  %s\n", e.link.c_str(), e.action.c_str(), when(e.time).c_str(), q.c_str(),
                (e.a + " <-> " + e.b).c_str(), e.evidence.c_str());
  };
  if (all) for (const auto& e : read.entries) show(e);
  else for (const auto& [ends, e] : latest) show(e);
  if (json) std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  if (read.entries.empty()) return static_cast<int>(Verdict::NoData);
  return any_quarantined ? static_cast<int>(Verdict::Fenced) : 0;
}

}  // namespace ringfence::tools
