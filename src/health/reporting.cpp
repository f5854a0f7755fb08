#include "reporting.hpp"

#include "ledger.hpp"  // unix_now

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <ringfence/error.hpp>
#include <stdexcept>

namespace ringfence {

namespace detail {

EventSink::~EventSink() {
  if (fd_ >= 0) ::close(fd_);
}

void EventSink::open(const std::string& path, int rank) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw SystemError(fmt::format("rank {}: cannot open RINGFENCE_HEALTH_LOG '{}': {}", rank, path, std::strerror(errno)), errno);
}

void EventSink::emit(HealthEvent e, int rank, std::uint64_t seq, std::uint64_t epoch, const Logger& log) noexcept {
  e.rank = rank;
  e.sequence = seq;
  e.epoch = epoch;
  e.unix_time = unix_now();
  try {
    if (callback_) callback_(e);
    if (fd_ >= 0) {
      const std::string line = to_json(e) + "\n";
      if (::write(fd_, line.data(), line.size()) < 0) log.warn("health log write failed: {}", std::strerror(errno));
    }
  } catch (const std::exception& ex) {
    log.warn("health event callback threw: {}", ex.what());
  } catch (...) {
  }
}

std::vector<LinkInfo> collect_links(int rank, const LaneState& lane0, const std::vector<std::unique_ptr<LaneState>>& extra,
                                    const LaneState* device) {
  std::vector<LinkInfo> out;
  // A link's entry: its peer, transport and state, then `add` sums its counters (and, for the
  // host lanes, the other lanes' links to the same peer).
  auto entry = [&](const Connection& ch, bool device_lane) {
    LinkInfo info;
    info.rank = rank;
    info.peer = ch.peer;
    info.transport = ch.transport_name;
    info.device_lane = device_lane;
    if (ch.link) info.state = ch.link->state();
    return info;
  };
  auto add = [](LinkInfo& info, const Connection& c) {
    if (!c.link) return;
    const LinkStats& s = c.link->stats();
    info.channels_used += s.bytes_written.load(std::memory_order_relaxed) > 0;
    info.bytes_written += s.bytes_written.load(std::memory_order_relaxed);
    info.writes += s.writes.load(std::memory_order_relaxed);
    info.signals += s.signals.load(std::memory_order_relaxed);
    info.errors += s.errors.load(std::memory_order_relaxed);
    info.retries += s.retries.load(std::memory_order_relaxed) + c.resends.load(std::memory_order_relaxed) +
                    c.reposts.load(std::memory_order_relaxed);
    info.checksum_errors += c.checksum_errors.load(std::memory_order_relaxed);
    info.wait_ms += static_cast<double>(s.wait_ns.load(std::memory_order_relaxed)) / 1e6;
    info.timed_bytes += c.timed_bytes.load(std::memory_order_relaxed) + s.timed_bytes.load(std::memory_order_relaxed);
    info.timed_ns += c.timed_ns.load(std::memory_order_relaxed) + s.timed_ns.load(std::memory_order_relaxed);
  };
  for (const auto& ch : lane0.connections) {
    LinkInfo info = entry(*ch, false);
    add(info, *ch);
    for (const auto& lane : extra)
      for (const auto& c : lane->connections)
        if (c->peer == ch->peer) add(info, *c);
    out.push_back(std::move(info));
  }
  if (device)
    for (const auto& ch : device->connections) {
      LinkInfo info = entry(*ch, true);
      add(info, *ch);
      out.push_back(std::move(info));
    }
  return out;
}

HealthSnapshot make_snapshot(int rank, std::uint64_t seq, const PlanState& plan, const HealthMonitor* monitor, AgreementCount agreed,
                             std::vector<LinkInfo> links) {
  HealthSnapshot h;
  h.rank = rank;
  h.sequence = seq;
  h.epoch = plan.epoch();
  h.ring = plan.ring().empty() ? std::vector<int>{0} : plan.ring();
  h.fenced = plan.fenced();
  h.relays = plan.relays();
  h.background_samples = monitor ? monitor->background_samples() : 0;
  h.agreements = agreed.agreements;
  h.agree_every = agreed.every;
  if (monitor) h.counters = monitor->counter_values();
  h.links = std::move(links);
  return h;
}

void write_prometheus(const std::string& path_template, int rank, const HealthSnapshot& h, const Logger& log) noexcept {
  if (path_template.empty()) return;
  try {
    std::string path = path_template;
    if (const auto at = path.find("{rank}"); at != std::string::npos) path.replace(at, 6, std::to_string(rank));
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << h.prometheus();
      if (!out) throw std::runtime_error("write failed");
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(std::strerror(errno));
  } catch (const std::exception& e) {
    log.warn("cannot write RINGFENCE_HEALTH_PROMETHEUS file: {}", e.what());
  }
}

}  // namespace detail

std::string HealthSnapshot::table() const {
  const std::string fences = to_string(fenced), via = to_string(relays);
  return fmt::format("rank {}: collectives {}, agreements {} (the next {} collectives after the last), epoch {}, ring {}, "
                     "fenced links: {}, relays: {}\n{}",
                     rank, sequence, agreements, agree_every, epoch, fmt::join(ring, "-"), fences.empty() ? "none" : fences,
                     via.empty() ? "none" : via, format_link_table(links));
}

std::string HealthSnapshot::prometheus() const {
  std::string out;
  auto metric = [&](std::string_view name, std::string_view help, std::string_view type) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // The device lane's links carry one more label, lane="device" (the host lanes' have none).
  auto lane = [](const LinkInfo& l) { return l.device_lane ? std::string_view(",lane=\"device\"") : std::string_view(); };
  metric("ringfence_link_state", "link state: 0 connecting, 1 up, 2 degraded, 3 fenced, 4 closed", "gauge");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_state{{rank=\"{}\",peer=\"{}\",transport=\"{}\"{}}} {}\n", l.rank, l.peer, l.transport,
                       lane(l), static_cast<int>(l.state));
  metric("ringfence_link_bytes_total", "payload bytes written to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_bytes_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l), l.bytes_written);
  metric("ringfence_link_checksum_errors_total", "corrupted chunks received from the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_checksum_errors_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l),
                       l.checksum_errors);
  metric("ringfence_link_resends_total", "chunks re-sent to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_resends_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l), l.retries);
  metric("ringfence_link_timed_bytes_total", "bytes of the timed writes (32 KiB and larger) to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_timed_bytes_total{{rank=\"{}\",peer=\"{}\"{}}} {}\n", l.rank, l.peer, lane(l), l.timed_bytes);
  metric("ringfence_link_timed_seconds_total", "time spent in the timed writes to the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_timed_seconds_total{{rank=\"{}\",peer=\"{}\"{}}} {:.9f}\n", l.rank, l.peer, lane(l),
                       static_cast<double>(l.timed_ns) / 1e9);
  metric("ringfence_link_write_gbps", "average speed of the timed writes to the peer so far, GB/s", "gauge");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_write_gbps{{rank=\"{}\",peer=\"{}\"{}}} {:.4f}\n", l.rank, l.peer, lane(l),
                       l.timed_ns ? static_cast<double>(l.timed_bytes) / static_cast<double>(l.timed_ns) : 0.0);
  metric("ringfence_link_wait_seconds_total", "time spent waiting on the peer", "counter");
  for (const auto& l : links)
    out += fmt::format("ringfence_link_wait_seconds_total{{rank=\"{}\",peer=\"{}\"{}}} {:.6f}\n", l.rank, l.peer, lane(l),
                       l.wait_ms / 1e3);
  metric("ringfence_collectives_total", "collectives issued", "counter");
  out += fmt::format("ringfence_collectives_total{{rank=\"{}\"}} {}\n", rank, sequence);
  metric("ringfence_epoch", "plan epoch (re-plans so far)", "gauge");
  out += fmt::format("ringfence_epoch{{rank=\"{}\"}} {}\n", rank, epoch);
  metric("ringfence_agreements_total", "fence agreements run", "counter");
  out += fmt::format("ringfence_agreements_total{{rank=\"{}\"}} {}\n", rank, agreements);
  metric("ringfence_agree_every", "collectives between the last fence agreement and the next (paced by time while all is well)", "gauge");
  out += fmt::format("ringfence_agree_every{{rank=\"{}\"}} {}\n", rank, agree_every);
  metric("ringfence_fenced_links", "links fenced by agreement", "gauge");
  out += fmt::format("ringfence_fenced_links{{rank=\"{}\"}} {}\n", rank, fenced.size());
  metric("ringfence_relays", "fenced ring hops carried through a third rank", "gauge");
  out += fmt::format("ringfence_relays{{rank=\"{}\"}} {}\n", rank, relays.size());
  // A mapped link's hardware counter: its labels, then its raw value and its window's events.
  auto counter_labels = [&](const HardwareCounter& c) {
    return fmt::format("rank=\"{}\",link=\"{}-{}\",source=\"{}\",device=\"{}\",port=\"{}\",counter=\"{}\"", rank, c.link.a, c.link.b,
                       c.source, c.device, c.port, c.name);
  };
  metric("ringfence_hw_counter", "raw value of a hardware counter the health policy reads for a mapped link", "gauge");
  for (const auto& c : counters)
    if (c.value) out += fmt::format("ringfence_hw_counter{{{}}} {}\n", counter_labels(c), *c.value);
  metric("ringfence_hw_counter_window_events", "events of that counter inside the policy's window", "gauge");
  for (const auto& c : counters)
    if (c.window_sum) out += fmt::format("ringfence_hw_counter_window_events{{{}}} {}\n", counter_labels(c), *c.window_sum);
  metric("ringfence_snapshot_unix_seconds", "when these figures were taken (wall clock)", "gauge");
  out += fmt::format("ringfence_snapshot_unix_seconds{{rank=\"{}\"}} {:.3f}\n", rank, detail::unix_now());
  return out;
}

std::string format_link_table(const std::vector<LinkInfo>& links) {
  std::string out = fmt::format("{:>5} {:>5} {:>9} {:>10} {:>14} {:>10} {:>10} {:>7} {:>9} {:>8} {:>10}\n", "rank", "peer",
                                "transport", "state", "bytes", "writes", "signals", "errors", "crc-errs", "resends",
                                "wait(ms)");
  for (const auto& l : links)
    out += fmt::format("{:>5} {:>5} {:>9} {:>10} {:>14} {:>10} {:>10} {:>7} {:>9} {:>8} {:>10.1f}{}\n", l.rank, l.peer,
                       l.transport, to_string(l.state), l.bytes_written, l.writes, l.signals, l.errors, l.checksum_errors,
                       l.retries, l.wait_ms, l.device_lane ? "  device lane" : "");
  return out;
}

}  // namespace ringfence
