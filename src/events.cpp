#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>
#include <ringfence/events.hpp>

namespace ringfence {

std::string_view to_string(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::ChecksumErrors: return "checksum_errors";
    case EventKind::FenceProposed: return "fence_proposed";
    case EventKind::LinkFenced: return "link_fenced";
    case EventKind::Replanned: return "replanned";
    case EventKind::NoPlan: return "no_plan";
    case EventKind::DigestMismatch: return "digest_mismatch";
    case EventKind::LinkReadmitted: return "link_readmitted";
    case EventKind::LinkSuspect: return "link_suspect";
    case EventKind::LinkHealthy: return "link_healthy";
    case EventKind::LinkMoved: return "link_moved";
    case EventKind::LinkSlow: return "link_slow";
    case EventKind::Straggler: return "straggler";
  }
  return "unknown";
}

std::optional<EventKind> parse_event_kind(std::string_view name) noexcept {
  for (int i = 0; i <= static_cast<int>(EventKind::Straggler); ++i)
    if (to_string(static_cast<EventKind>(i)) == name) return static_cast<EventKind>(i);
  return std::nullopt;
}

namespace {
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;  // details never need control characters
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string to_json(const HealthEvent& e) {
  return fmt::format(
      "{{\"event\":\"{}\",\"rank\":{},\"link\":\"{}\",\"seq\":{},\"epoch\":{},\"count\":{},\"detail\":\"{}\",\"time\":{:.6f}}}",
      to_string(e.kind), e.rank, e.a >= 0 ? fmt::format("{}-{}", e.a, e.b) : std::string(), e.sequence, e.epoch, e.count,
      escape(e.detail), e.unix_time);
}

// A real JSON parser: a log that a shipper re-formatted (spaces, another key order, escapes)
// reads the same; anything that is not one event object is rejected.
std::optional<HealthEvent> parse_event_json(std::string_view line) noexcept {
  try {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    auto text = [&](const char* key) -> const std::string* {
      const auto it = j.find(key);
      return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
    };
    auto unsigned_number = [&](const char* key, auto& out) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_number_unsigned()) return false;
      out = it->template get<std::remove_reference_t<decltype(out)>>();
      return true;
    };
    HealthEvent e;
    const std::string* kind = text("event");
    const auto k = kind ? parse_event_kind(*kind) : std::nullopt;
    if (!k) return std::nullopt;
    e.kind = *k;
    const auto rank = j.find("rank");
    if (rank == j.end() || !rank->is_number_integer()) return std::nullopt;
    e.rank = rank->get<int>();
    if (!unsigned_number("seq", e.sequence) || !unsigned_number("epoch", e.epoch) || !unsigned_number("count", e.count))
      return std::nullopt;
    if (const std::string* link = text("link"); link && !link->empty()) {
      const auto dash = link->find('-');
      if (dash == std::string::npos) return std::nullopt;
      const auto parse = [](std::string_view s, int& out) {
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
        return ec == std::errc() && p == s.data() + s.size() && !s.empty();
      };
      if (!parse(std::string_view(*link).substr(0, dash), e.a) || !parse(std::string_view(*link).substr(dash + 1), e.b))
        return std::nullopt;
    }
    if (const std::string* detail = text("detail")) e.detail = *detail;
    if (const auto t = j.find("time"); t != j.end() && t->is_number()) e.unix_time = t->get<double>();
    return e;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace ringfence
