#include <fmt/format.h>

#include <charconv>
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

// Finds `"key":` and returns the raw value text (string without quotes, or number).
std::optional<std::string> field(std::string_view line, std::string_view key) {
  const std::string pattern = fmt::format("\"{}\":", key);
  const auto at = line.find(pattern);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + pattern.size());
  if (!rest.empty() && rest.front() == '"') {
    std::string out;
    for (std::size_t i = 1; i < rest.size(); ++i) {
      if (rest[i] == '\\' && i + 1 < rest.size()) {
        out.push_back(rest[++i]);
      } else if (rest[i] == '"') {
        return out;
      } else {
        out.push_back(rest[i]);
      }
    }
    return std::nullopt;
  }
  const auto end = rest.find_first_of(",}");
  return std::string(rest.substr(0, end));
}

template <class T>
bool number(const std::optional<std::string>& text, T& out) {
  if (!text) return false;
  const auto [p, ec] = std::from_chars(text->data(), text->data() + text->size(), out);
  return ec == std::errc() && p == text->data() + text->size();
}
}  // namespace

std::string to_json(const HealthEvent& e) {
  return fmt::format(
      "{{\"event\":\"{}\",\"rank\":{},\"link\":\"{}\",\"seq\":{},\"epoch\":{},\"count\":{},\"detail\":\"{}\",\"time\":{:.6f}}}",
      to_string(e.kind), e.rank, e.a >= 0 ? fmt::format("{}-{}", e.a, e.b) : std::string(), e.sequence, e.epoch, e.count,
      escape(e.detail), e.unix_time);
}

std::optional<HealthEvent> parse_event_json(std::string_view line) noexcept {
  try {
    HealthEvent e;
    const auto kind = field(line, "event");
    if (!kind) return std::nullopt;
    const auto k = parse_event_kind(*kind);
    if (!k) return std::nullopt;
    e.kind = *k;
    if (!number(field(line, "rank"), e.rank) || !number(field(line, "seq"), e.sequence) ||
        !number(field(line, "epoch"), e.epoch) || !number(field(line, "count"), e.count))
      return std::nullopt;
    const auto link = field(line, "link");
    if (link && !link->empty()) {
      const auto dash = link->find('-');
      if (dash == std::string::npos || !number(std::optional<std::string>(link->substr(0, dash)), e.a) ||
          !number(std::optional<std::string>(link->substr(dash + 1)), e.b))
        return std::nullopt;
    }
    e.detail = field(line, "detail").value_or("");
    if (const auto t = field(line, "time")) e.unix_time = std::strtod(t->c_str(), nullptr);
    return e;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace ringfence
