#include <ringfence/log.hpp>

namespace ringfence {

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
  if (name == "warning") return LogLevel::Warn;
  for (int i = 0; i <= static_cast<int>(LogLevel::Trace); ++i)
    if (to_string(static_cast<LogLevel>(i)) == name) return static_cast<LogLevel>(i);
  return std::nullopt;
}

void Logger::write(LogLevel level, std::string_view message) const noexcept {
  if (!sink_) return;
  // One fmt::print = one fwrite of a complete line, so ranks sharing a terminal do not
  // interleave inside a line.
  try {
    if (rank_ >= 0)
      fmt::print(sink_, "[ringfence {}] {}: {}\n", rank_, to_string(level), message);
    else
      fmt::print(sink_, "[ringfence] {}: {}\n", to_string(level), message);
  } catch (...) {
  }
}

}  // namespace ringfence
