// Log levels, line format and log files (log.hpp; docs/logging.md).
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>

namespace ringfence {
namespace {

constexpr std::string_view kUpper[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

bool equal_ignoring_case(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// The host's name, cut at the first dot as NCCL prints it; "?" when unknown.
std::string short_host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "?";
  std::string h = host;
  return h.substr(0, h.find('.'));
}

}  // namespace

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::Error: return "error";
    case LogLevel::Warn: return "warn";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
    case LogLevel::Trace: return "trace";
  }
  return "unknown";
}

std::optional<LogLevel> parse_log_level(std::string_view name) noexcept {
  if (equal_ignoring_case(name, "warning")) return LogLevel::Warn;
  for (int i = 0; i <= static_cast<int>(LogLevel::Trace); ++i)
    if (equal_ignoring_case(to_string(static_cast<LogLevel>(i)), name)) return static_cast<LogLevel>(i);
  return std::nullopt;
}

void Logger::write(LogLevel level, std::string_view message) const noexcept {
  if (!sink_) return;
  // One fmt::print = one fwrite of a complete line, so ranks sharing a terminal or a file do
  // not interleave inside a line.
  try {
    std::string line;
    if (timestamps_) {
      const auto now = std::chrono::system_clock::now();
      const std::time_t secs = std::chrono::system_clock::to_time_t(now);
      const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
      std::tm utc{};
      ::gmtime_r(&secs, &utc);
      char stamp[32];
      std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
      line = fmt::format("{}.{:06d}Z ", stamp, micros);
    }
    const auto tid = static_cast<long>(::syscall(SYS_gettid));
    fmt::format_to(std::back_inserter(line), "{}:{}:{} ", short_host_name(), ::getpid(), tid);
    if (rank_ >= 0) fmt::format_to(std::back_inserter(line), "[{}] ", rank_);
    fmt::format_to(std::back_inserter(line), "{} {}: {}\n", kUpper[static_cast<int>(level)], subsystem_, message);
    std::fwrite(line.data(), 1, line.size(), sink_);
  } catch (...) {
  }
}

std::string expand_log_path(std::string_view pattern, int rank) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'h': out += short_host_name(); break;
      case 'p': out += std::to_string(::getpid()); break;
      case 'r': out += rank >= 0 ? std::to_string(rank) : std::string("-"); break;
      case '%': out += '%'; break;
      default: out += '%'; out += pattern[i]; break;
    }
  }
  return out;
}

Logger make_logger(LogLevel level, int rank, std::string_view file_pattern, bool timestamps) {
  Logger log(level, rank);
  if (!file_pattern.empty()) {
    const std::string path = expand_log_path(file_pattern, rank);
    std::FILE* f = std::fopen(path.c_str(), "ae");  // append: ranks and jobs may share a file
    if (!f)
      throw InvalidUsage(fmt::format("rank {}: RINGFENCE_LOG_FILE: cannot open '{}' (from '{}'): {}", rank, path, file_pattern,
                                     std::strerror(errno)));
    std::setvbuf(f, nullptr, _IOLBF, 0);  // a line reaches the file when it is logged
    log = Logger(level, rank, std::shared_ptr<std::FILE>(f, [](std::FILE* p) { std::fclose(p); }));
  }
  log.set_timestamps(timestamps);
  return log;
}

}  // namespace ringfence
