// The health ledger (ledger.hpp): JSON lines, appended under flock, read tolerantly.
#include "ledger.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ringfence/error.hpp>

namespace ringfence::detail {

double unix_now() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string to_json(const LedgerEntry& e) {
  return nlohmann::json{{"time", e.time},         {"action", e.action},      {"a", e.a},
                        {"b", e.b},               {"link", e.link},          {"evidence", e.evidence},
                        {"quarantine_s", e.quarantine_s}, {"writer", e.writer}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<LedgerEntry> parse_ledger_line(std::string_view line) noexcept {
  try {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    auto text = [&](const char* key, std::string& out) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_string()) return false;
      out = it->get<std::string>();
      return true;
    };
    auto number = [&](const char* key, double& out) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_number()) return false;
      out = it->get<double>();
      return true;
    };
    LedgerEntry e;
    if (!number("time", e.time) || !text("action", e.action) || !text("a", e.a) || !text("b", e.b)) return std::nullopt;
    if (e.action != "fenced" && e.action != "moved" && e.action != "readmitted" && e.action != "cleared") return std::nullopt;
    if (e.a.empty() || e.b.empty()) return std::nullopt;
    text("link", e.link);
    text("evidence", e.evidence);
    text("writer", e.writer);
    number("quarantine_s", e.quarantine_s);
    return e;
  } catch (...) {
    return std::nullopt;
  }
}

LedgerRead read_ledger(const std::string& path) {
  LedgerRead r;
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return r;  // no ledger yet: nothing known
    throw SystemError(fmt::format("cannot read the health ledger '{}': {}", path, std::strerror(errno)), errno);
  }
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (auto e = parse_ledger_line(line)) r.entries.push_back(std::move(*e));
    else ++r.skipped;
  }
  return r;
}

void append_ledger(const std::string& path, const LedgerEntry& e) {
  const std::string line = to_json(e) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw SystemError(fmt::format("cannot open the health ledger '{}': {}", path, std::strerror(errno)), errno);
  // O_APPEND alone keeps local appends whole; the lock also covers file systems (NFS) where
  // appends from several nodes are not atomic.
  int err = 0;
  if (::flock(fd, LOCK_EX) != 0) err = errno;
  ssize_t n = 0;
  if (err == 0) {
    do n = ::write(fd, line.data(), line.size());
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(line.size())) err = n < 0 ? errno : EIO;
  }
  ::close(fd);  // releases the lock
  if (err != 0) throw SystemError(fmt::format("cannot append to the health ledger '{}': {}", path, std::strerror(err)), err);
}

std::map<std::pair<std::string, std::string>, LedgerEntry> latest_by_link(const std::vector<LedgerEntry>& entries) {
  std::map<std::pair<std::string, std::string>, LedgerEntry> out;
  for (const auto& e : entries) {
    auto key = e.a < e.b ? std::pair{e.a, e.b} : std::pair{e.b, e.a};
    auto it = out.find(key);
    if (it == out.end()) {
      out.emplace(key, e);
      continue;
    }
    LedgerEntry& kept = it->second;
    // Both ends of one decision write a line: the proposer with its evidence, the other end
    // "agreed". They read their clocks at slightly different moments and append in either
    // order, so the line with the evidence may be the earlier one in time, in the file, or
    // both: within one decision the evidence wins, and the later time counts.
    const bool same_decision = e.action == kept.action && std::abs(e.time - kept.time) < kSameDecisionSeconds;
    const bool e_agreed = e.evidence.starts_with(kAgreedElsewhere), kept_agreed = kept.evidence.starts_with(kAgreedElsewhere);
    if (same_decision && e_agreed != kept_agreed) {
      const double time = std::max(e.time, kept.time);
      if (kept_agreed) kept = e;
      kept.time = time;
    } else if (e.time >= kept.time) {
      kept = e;
    }
  }
  return out;
}

double quarantine_left(const LedgerEntry& e, double now) noexcept {
  if (e.action != "fenced" && e.action != "moved") return 0;
  return e.time + e.quarantine_s - now;
}

std::vector<std::string> endpoint_identities(const std::vector<PeerInfo>& peers) {
  std::vector<std::string> out;
  std::map<std::string, int> on_host;  // ranks seen so far per host
  for (const auto& p : peers) {
    const int k = on_host[p.host_id]++;
    out.push_back(p.gpu_bus_id.empty() ? fmt::format("{}/rank-on-host:{}", p.host_id, k) : fmt::format("{}/gpu:{}", p.host_id, p.gpu_bus_id));
  }
  return out;
}

}  // namespace ringfence::detail
