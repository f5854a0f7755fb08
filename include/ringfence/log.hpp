#pragma once
/// \file log.hpp
/// Levelled logging through fmt. A `Logger` is a small value owned by a communicator (no global
/// logger, no global level); copies are cheap and share the file they write to. Lines look like
/// NCCL's (docs/logging.md):
///
///     [2026-12-02T13:40:01.123456Z ]host:pid:tid [rank] LEVEL subsystem: message

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string_view>

namespace ringfence {

/// Verbosity, from quiet to chatty. `RINGFENCE_LOG` selects it (default `Warn`).
enum class LogLevel : int { Error = 0, Warn, Info, Debug, Trace };

/// "error", "warn", "info", "debug", "trace".
std::string_view to_string(LogLevel level) noexcept;
/// Parses the names of `to_string` (and "warning") in any case ("INFO", "Warn"); nullopt
/// otherwise.
std::optional<LogLevel> parse_log_level(std::string_view name) noexcept;

/// Writes one line per message (format above) to a `FILE*`, stderr by default. Thread-safe to
/// the extent that one `fmt::print` call is one `fwrite` (lines never interleave mid-line on
/// glibc). Logging is for the control plane and error paths only.
class Logger {
 public:
  /// A logger at `level` for `rank` (-1 prints no rank) writing to `sink` (not owned).
  explicit Logger(LogLevel level = LogLevel::Warn, int rank = -1, std::FILE* sink = stderr) noexcept
      : level_(level), rank_(rank), sink_(sink) {}
  /// A logger writing to a file that it and its copies share; the last one closes it.
  Logger(LogLevel level, int rank, std::shared_ptr<std::FILE> file) noexcept
      : level_(level), rank_(rank), sink_(file.get()), file_(std::move(file)) {}

  /// A copy whose lines name `subsystem` (a string that outlives every copy, e.g. a literal)
  /// instead of "ringfence".
  Logger with_subsystem(const char* subsystem) const noexcept {
    Logger copy = *this;
    copy.subsystem_ = subsystem;
    return copy;
  }
  /// Starts every line with the UTC time to the microsecond (`RINGFENCE_LOG_TIMESTAMP=on`).
  void set_timestamps(bool on) noexcept { timestamps_ = on; }
  /// True when lines start with the time.
  bool timestamps() const noexcept { return timestamps_; }

  /// True when messages at `level` are printed.
  bool enabled(LogLevel level) const noexcept { return static_cast<int>(level) <= static_cast<int>(level_); }
  /// Current level.
  LogLevel level() const noexcept { return level_; }
  /// Rank shown in the prefix.
  int rank() const noexcept { return rank_; }
  /// Changes the rank shown in the prefix.
  void set_rank(int rank) noexcept { rank_ = rank; }

  /// Formats and prints one line when `level` is enabled. Never throws (formatting errors are
  /// swallowed: a log line must not take a job down).
  template <class... Args>
  void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) const noexcept {
    if (!enabled(level)) return;
    try {
      write(level, fmt::format(format, std::forward<Args>(args)...));
    } catch (...) {
    }
  }
  /// Shorthands for `log(LogLevel::X, ...)`.
  template <class... Args>
  void error(fmt::format_string<Args...> f, Args&&... a) const noexcept { log(LogLevel::Error, f, std::forward<Args>(a)...); }
  template <class... Args>
  void warn(fmt::format_string<Args...> f, Args&&... a) const noexcept { log(LogLevel::Warn, f, std::forward<Args>(a)...); }
  template <class... Args>
  void info(fmt::format_string<Args...> f, Args&&... a) const noexcept { log(LogLevel::Info, f, std::forward<Args>(a)...); }
  template <class... Args>
  void debug(fmt::format_string<Args...> f, Args&&... a) const noexcept { log(LogLevel::Debug, f, std::forward<Args>(a)...); }
  template <class... Args>
  void trace(fmt::format_string<Args...> f, Args&&... a) const noexcept { log(LogLevel::Trace, f, std::forward<Args>(a)...); }

 private:
  void write(LogLevel level, std::string_view message) const noexcept;

  LogLevel level_;
  int rank_;
  std::FILE* sink_;
  std::shared_ptr<std::FILE> file_;  // keeps an opened file open while any copy lives
  const char* subsystem_ = "ringfence";
  bool timestamps_ = false;
};

/// The path `pattern` names for this process: `%h` the host name, `%p` the pid, `%r` `rank`
/// (`-` when negative), `%%` a percent sign (as NCCL_DEBUG_FILE, plus `%r`). Any other `%x` is
/// kept as written.
std::string expand_log_path(std::string_view pattern, int rank);

/// The logger a communicator's options describe: `level` for `rank`, lines appended to the file
/// `file_pattern` names (`expand_log_path`; created if missing) or to stderr when it is empty,
/// timestamped when `timestamps`. Throws `InvalidUsage` naming RINGFENCE_LOG_FILE, the path and
/// the reason when the file cannot be opened.
Logger make_logger(LogLevel level, int rank, std::string_view file_pattern = {}, bool timestamps = false);

/// Keeps a warning that strangers can trigger (refused connections, floods) from flooding the
/// log: the first `burst` occurrences in each `window` pass, the rest are counted, and the next
/// one that passes reports how many were held back. Not thread-safe: one per accept loop.
class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(int burst = 3, Clock::duration window = std::chrono::seconds(10)) noexcept
      : burst_(burst), window_(window) {}

  /// True when this occurrence should be logged; then `held_back` is how many were not logged
  /// since the last one that was (0 usually).
  bool allow(std::uint64_t& held_back, Clock::time_point now = Clock::now()) noexcept {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      passed_ = 0;
    }
    if (passed_ >= burst_) {
      ++held_;
      return false;
    }
    ++passed_;
    held_back = held_;
    held_ = 0;
    return true;
  }

 private:
  int burst_;
  Clock::duration window_;
  Clock::time_point window_start_{};
  int passed_ = 0;
  std::uint64_t held_ = 0;
};

}  // namespace ringfence
