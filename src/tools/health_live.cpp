// ringfence-health --live (health_live.hpp): reads the ranks' Prometheus text files, joins
// them per link and judges each link against the job's other links on the same transport.
#include "health_live.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "../health/ledger.hpp"  // unix_now

namespace ringfence::tools {

namespace {

// One sample line of the text exposition format: name{label="value",...} number.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::optional<Sample> parse_sample(const std::string& line) {
  if (line.empty() || line[0] == '#') return std::nullopt;
  Sample s;
  std::size_t i = line.find_first_of("{ ");
  if (i == std::string::npos) return std::nullopt;
  s.name = line.substr(0, i);
  if (line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const std::size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
      std::string key = line.substr(i, eq - i), value;
      std::size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) ++j;
        value.push_back(line[j]);
      }
      if (j >= line.size()) return std::nullopt;
      s.labels[key] = value;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;
  }
  try {
    s.value = std::stod(line.substr(i));
  } catch (...) {
    return std::nullopt;
  }
  return s;
}

using LinkKey = std::tuple<int, int, bool>;  // rank, peer, device lane

struct LiveLink {
  std::string transport;
  int state = -1;  // LinkState as a number; -1 unknown
  double checksum_errors = 0, resends = 0, timed_bytes = 0, timed_s = 0, wait_s = 0;
  double hw_events = 0;  // events of the link's hardware counters in the policy's window (mapped links)
  double gbps = -1;  // recent (or average, on the first reading); -1 = no timed writes
  std::string verdict_state;
};

struct RankInfo {
  double collectives = 0, epoch = 0, fenced_links = 0, time = 0;
};

struct Reading {
  std::map<LinkKey, LiveLink> links;
  std::map<int, RankInfo> ranks;
};

Reading read_dir(const std::string& dir) {
  Reading r;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".prom") continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      const auto s = parse_sample(line);
      if (!s || !s->labels.count("rank")) continue;
      const int rank = std::atoi(s->labels.at("rank").c_str());
      if (s->name == "ringfence_hw_counter_window_events" && s->labels.count("link")) {
        // Counters are per link "a-b": this rank's end of it.
        const std::string& link = s->labels.at("link");
        const auto dash = link.find('-');
        if (dash == std::string::npos) continue;
        const int a = std::atoi(link.substr(0, dash).c_str()), b = std::atoi(link.substr(dash + 1).c_str());
        r.links[{rank, rank == a ? b : a, false}].hw_events += s->value;
        continue;
      }
      if (s->labels.count("peer")) {
        LiveLink& l = r.links[{rank, std::atoi(s->labels.at("peer").c_str()), s->labels.count("lane") > 0}];
        if (s->name == "ringfence_link_state") {
          l.state = static_cast<int>(s->value);
          l.transport = s->labels.count("transport") ? s->labels.at("transport") : "";
        } else if (s->name == "ringfence_link_checksum_errors_total") {
          l.checksum_errors = s->value;
        } else if (s->name == "ringfence_link_resends_total") {
          l.resends = s->value;
        } else if (s->name == "ringfence_link_timed_bytes_total") {
          l.timed_bytes = s->value;
        } else if (s->name == "ringfence_link_timed_seconds_total") {
          l.timed_s = s->value;
        } else if (s->name == "ringfence_link_wait_seconds_total") {
          l.wait_s = s->value;
        }
      } else {
        RankInfo& ri = r.ranks[rank];
        if (s->name == "ringfence_collectives_total") ri.collectives = s->value;
        else if (s->name == "ringfence_epoch") ri.epoch = s->value;
        else if (s->name == "ringfence_fenced_links") ri.fenced_links = s->value;
        else if (s->name == "ringfence_snapshot_unix_seconds") ri.time = s->value;
      }
    }
  }
  return r;
}

// Per link, the two latest readings whose timed writes differ: a rank refreshes its file only
// every RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS, so two readings may show the same figures.
struct Timed {
  double bytes = 0, s = 0;
};
using History = std::map<LinkKey, std::pair<Timed, Timed>>;  // (previous, latest)

// Recent speeds (between the two latest distinct readings; the average until there are two),
// each link's state, and the verdict. A link whose recent speed is under a third of the median
// of the job's links on its transport is slow.
Verdict judge(Reading& now, History& history) {
  std::map<std::string, std::vector<double>> speeds;
  for (auto& [key, l] : now.links) {
    auto [it, fresh] = history.try_emplace(key, std::pair<Timed, Timed>{Timed{}, Timed{l.timed_bytes, l.timed_s}});
    auto& [previous, latest] = it->second;
    if (!fresh && l.timed_s != latest.s) {
      previous = latest;
      latest = Timed{l.timed_bytes, l.timed_s};
    }
    if (latest.s > previous.s && previous.s > 0) l.gbps = (latest.bytes - previous.bytes) / (latest.s - previous.s) / 1e9;
    else if (l.timed_s > 0) l.gbps = l.timed_bytes / l.timed_s / 1e9;
    if (l.gbps >= 0) speeds[l.transport].push_back(l.gbps);
  }
  Verdict v = now.links.empty() ? Verdict::NoData : Verdict::Healthy;
  for (auto& [key, l] : now.links) {
    auto& list = speeds[l.transport];
    double median = -1;
    if (list.size() >= 2) {
      std::vector<double> sorted = list;
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
      median = sorted[sorted.size() / 2];
    }
    const bool slow = median > 0 && l.gbps >= 0 && l.gbps * 3 < median;
    if (l.state == 3) {
      l.verdict_state = "fenced";
      v = worse(v, Verdict::Fenced);
    } else if (l.state == 2 || l.checksum_errors > 0 || l.hw_events > 0 || slow) {
      l.verdict_state = slow ? "slow" : "suspect";
      v = worse(v, Verdict::Suspect);
    } else {
      l.verdict_state = l.state == 1 ? "ok" : l.state == 0 ? "connecting" : l.state == 4 ? "closed" : "?";
    }
  }
  for (const auto& [rank, ri] : now.ranks)
    if (ri.fenced_links > 0) v = worse(v, Verdict::Fenced);
  return v;
}

void print(const Reading& r, Verdict v, const LiveOptions& o, bool tty) {
  const double now = detail::unix_now();
  if (o.json) {
    nlohmann::json out{{"time", now}, {"verdict", to_string(v)}, {"links", nlohmann::json::array()}, {"ranks", nlohmann::json::array()}};
    for (const auto& [key, l] : r.links)
      out["links"].push_back({{"rank", std::get<0>(key)},
                              {"peer", std::get<1>(key)},
                              {"lane", std::get<2>(key) ? "device" : "host"},
                              {"transport", l.transport},
                              {"state", l.verdict_state},
                              {"gbps", l.gbps >= 0 ? nlohmann::json(l.gbps) : nlohmann::json(nullptr)},
                              {"checksum_errors", l.checksum_errors},
                              {"resends", l.resends},
                              {"hw_counter_events", l.hw_events},
                              {"wait_s", l.wait_s}});
    for (const auto& [rank, ri] : r.ranks)
      out["ranks"].push_back({{"rank", rank}, {"collectives", ri.collectives}, {"epoch", ri.epoch}, {"fenced_links", ri.fenced_links},
                              {"age_s", ri.time > 0 ? nlohmann::json(now - ri.time) : nlohmann::json(nullptr)}});
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (tty) std::printf("\033[H\033[2J");
    std::printf("ringfence-health --live %s: %zu ranks, %zu links, verdict %s\n", o.dir.c_str(), r.ranks.size(), r.links.size(),
                to_string(v));
    std::printf("%5s %5s %9s %10s %9s %10s %8s %10s %9s\n", "rank", "peer", "transport", "state", "GB/s", "crc-errs", "resends", "wait(ms)",
                "hw-events");
    for (const auto& [key, l] : r.links) {
      char gbps[32] = "-";
      if (l.gbps >= 0) std::snprintf(gbps, sizeof gbps, "%.2f", l.gbps);
      std::printf("%5d %5d %9s %10s %9s %10.0f %8.0f %10.1f %9.0f%s\n", std::get<0>(key), std::get<1>(key), l.transport.c_str(),
                  l.verdict_state.c_str(), gbps, l.checksum_errors, l.resends, l.wait_s * 1e3, l.hw_events,
                  std::get<2>(key) ? "  device lane" : "");
    }
    for (const auto& [rank, ri] : r.ranks)
      std::printf("rank %d: %.0f collectives, epoch %.0f, %.0f fenced links, figures %.1f s old\n", rank, ri.collectives, ri.epoch,
                  ri.fenced_links, ri.time > 0 ? now - ri.time : -1.0);
    if (r.links.empty()) std::printf("no link figures in %s/*.prom yet\n", o.dir.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

Verdict run_live(const LiveOptions& o) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  History history;
  Reading first = read_dir(o.dir);
  judge(first, history);
  Verdict v = Verdict::NoData;
  for (int shown = 0; o.count == 0 || shown < o.count; ++shown) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.interval_s));
    Reading now = read_dir(o.dir);
    v = judge(now, history);
    print(now, v, o, tty);
  }
  return v;
}

}  // namespace ringfence::tools
