#include "monitor.hpp"

#include <algorithm>
#include <charconv>
#include <ringfence/error.hpp>

namespace ringfence::detail {

std::vector<LinkSource> parse_link_map(std::string_view text, bool* automatic) {
  std::vector<LinkSource> out;
  if (automatic) *automatic = false;
  while (!text.empty()) {
    const auto semi = text.find(';');
    const std::string_view entry = text.substr(0, semi);
    text = semi == std::string_view::npos ? std::string_view{} : text.substr(semi + 1);
    if (entry.empty()) continue;
    if (entry == "auto" && automatic) {
      *automatic = true;
      continue;
    }
    auto bad = [&](std::string_view why) {
      return InvalidUsage(fmt::format("RINGFENCE_HEALTH_LINK_MAP entry '{}': {} (expected A-B=nvml:<gpu>:<nvlink>, "
                                      "A-B=ib:<device>:<port>, A-B=pcie:<address> or auto)",
                                      entry, why));
    };
    const auto eq = entry.find('='), dash = entry.find('-');
    if (eq == std::string_view::npos || dash == std::string_view::npos || dash > eq) throw bad("no A-B=");
    int a = -1, b = -1;
    if (std::from_chars(entry.data(), entry.data() + dash, a).ec != std::errc() ||
        std::from_chars(entry.data() + dash + 1, entry.data() + eq, b).ec != std::errc() || a < 0 || b < 0 || a == b)
      throw bad("bad ranks");
    LinkSource s;
    s.link = LinkId::of(a, b);
    std::string_view spec = entry.substr(eq + 1);
    const auto colon = spec.find(':');
    if (colon == std::string_view::npos) throw bad("no source");
    const std::string_view kind = spec.substr(0, colon);
    spec = spec.substr(colon + 1);
    if (kind == "pcie") {
      s.kind = LinkSource::Kind::Pcie;
      s.device = std::string(spec);
    } else if (kind == "nvml" || kind == "ib") {
      s.kind = kind == "nvml" ? LinkSource::Kind::Nvml : LinkSource::Kind::Ib;
      const auto last = spec.rfind(':');
      if (last == std::string_view::npos) throw bad("no port / link index");
      s.device = std::string(spec.substr(0, last));
      if (std::from_chars(spec.data() + last + 1, spec.data() + spec.size(), s.port).ec != std::errc() || s.port < 0)
        throw bad("bad port / link index");
    } else {
      throw bad("unknown source kind");
    }
    if (s.device.empty()) throw bad("empty device");
    out.push_back(std::move(s));
  }
  return out;
}

HealthMonitor::HealthMonitor(const health::HealthOptions& options, std::vector<LinkSource> map,
                             std::vector<LinkId> transport_links, const Logger& log)
    : options_(options), map_(std::move(map)), log_(log), bank_(options.window) {
  transport_links_ = std::move(transport_links);
  for (const LinkId& l : transport_links_) policies_.try_emplace({l.a, l.b}, options_);
  bool need_nvml = false, need_sysfs = false;
  std::vector<std::string> pci;
  for (const auto& s : map_) {
    need_nvml |= s.kind == LinkSource::Kind::Nvml;
    need_sysfs |= s.kind != LinkSource::Kind::Nvml;
    if (s.kind == LinkSource::Kind::Pcie) pci.push_back(s.device);
    policies_.try_emplace({s.link.a, s.link.b}, options_);
  }
  if (need_nvml) {
    nvml_ = std::make_unique<health::NvmlSource>(options_.nvml_library);
    if (!nvml_->available())
      log_.warn("health: NVML unavailable ({}); NVLink counters read as unknown", nvml_->unavailable_reason());
  }
  if (need_sysfs) sysfs_ = std::make_unique<health::SysfsSource>(options_.sysfs_root, pci);
  // A first read sets every counter's baseline (and registers NVML's Xid event set), so the
  // first agreement already judges deltas: an error between setup and then counts.
  if (!map_.empty()) sample_locked(std::chrono::steady_clock::now());
}

HealthMonitor::~HealthMonitor() { stop(); }

void HealthMonitor::sample_locked(health::TimePoint now) {
  if (nvml_ && nvml_->available()) bank_.update(nvml_->read_counters(), now);
  if (sysfs_) bank_.update(sysfs_->read_counters(), now);
}

std::vector<ringfence::HardwareCounter> HealthMonitor::counter_values() const {
  std::vector<ringfence::HardwareCounter> out;
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  bank_.for_each([&](const health::CounterId& id, const health::CounterTracker& tracker) {
    for (const LinkSource& s : map_) {
      const char* source = s.kind == LinkSource::Kind::Nvml ? "nvml" : s.kind == LinkSource::Kind::Ib ? "ib" : "pcie";
      if (id.source != source || id.device != s.device || (s.kind != LinkSource::Kind::Pcie && id.port != s.port)) continue;
      const health::WindowStats w = tracker.stats(now);
      out.push_back(ringfence::HardwareCounter{s.link, id.source, id.device, id.port, id.name, tracker.last_value(),
                                    w.sum ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(*w.sum)) : std::nullopt});
    }
  });
  return out;
}

void HealthMonitor::sample(health::TimePoint now) {
  std::lock_guard lock(mutex_);
  sample_locked(now);
}

void HealthMonitor::start(std::chrono::milliseconds interval) {
  if (map_.empty() || interval.count() <= 0 || sampler_.joinable()) return;
  stopping_ = false;
  sampler_ = std::thread([this, interval] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      try {
        sample_locked(std::chrono::steady_clock::now());
        background_samples_.fetch_add(1, std::memory_order_relaxed);
      } catch (const std::exception& e) {  // sources never throw on sampling; stay alive if one does
        log_.warn("health: background sample failed: {}", e.what());
      }
      wake_.wait_for(lock, interval, [this] { return stopping_; });
    }
  });
}

void HealthMonitor::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (sampler_.joinable()) sampler_.join();
}

void HealthMonitor::fence(LinkId link, const std::string& reason, health::TimePoint now) {
  std::lock_guard lock(mutex_);
  const auto it = policies_.find({link.a, link.b});
  if (it == policies_.end()) return;
  if (auto t = it->second.fence(reason, now))
    log_.info("health: link {}-{} {} -> {} ({})", link.a, link.b, to_string(t->from), to_string(t->to), reason);
}

void HealthMonitor::moved(LinkId link) {
  std::lock_guard lock(mutex_);
  const auto it = policies_.find({link.a, link.b});
  if (it == policies_.end()) return;
  std::erase_if(map_, [&](const LinkSource& s) { return s.link == link; });
  policies_.erase(it);
  if (std::find(transport_links_.begin(), transport_links_.end(), link) != transport_links_.end())
    policies_.try_emplace({link.a, link.b}, options_);
  log_.info("health: link {}-{} moved to another transport: judged afresh{}", link.a, link.b,
            policies_.count({link.a, link.b}) ? "" : " (no longer judged: its mapped counters described the old path)");
}

std::vector<HealthMonitor::Assessment> HealthMonitor::evaluate(health::TimePoint now,
                                                              std::span<const TransportObservation> transport) {
  std::vector<Assessment> out;
  if (policies_.empty()) return out;
  std::lock_guard lock(mutex_);
  if (!map_.empty()) sample_locked(now);
  for (auto& [key, policy] : policies_) {
    const LinkId link{key.first, key.second};
    health::Evidence e;
    for (const auto& s : map_) {  // hardware evidence (a link mapped twice: the last entry's fields win)
      if (s.link != link) continue;
      switch (s.kind) {
        case LinkSource::Kind::Nvml: health::add_nvml_evidence(e, bank_, s.device, s.port, now); break;
        case LinkSource::Kind::Ib: health::add_ib_evidence(e, bank_, s.device, s.port, now); break;
        case LinkSource::Kind::Pcie: health::add_pcie_evidence(e, bank_, s.device, now); break;
      }
    }
    for (const auto& t : transport) {  // what this rank's transport saw on the link
      if (t.link != link) continue;
      e.checksum_mismatches += t.checksum_mismatches;
      e.successes += t.successes;
      e.timeouts += t.timeouts;
      if (t.bandwidth_ratio) e.bandwidth_ratio = t.bandwidth_ratio;
    }
    Assessment a{link, health::PolicyState::Healthy, {}, policy.observe(e, now)};
    a.state = policy.state();
    if (a.change) {
      log_.info("health: link {}-{} {} -> {}", link.a, link.b, to_string(a.change->from), to_string(a.change->to));
      for (const auto& r : a.change->reasons) a.why += (a.why.empty() ? "" : "; ") + r;
    }
    if (a.state == health::PolicyState::Fenced && !a.change) {
      for (const auto& r : policy.last_verdict().reasons) a.why += (a.why.empty() ? "" : "; ") + r;
      if (a.why.empty()) a.why = "policy: fenced";
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace ringfence::detail
