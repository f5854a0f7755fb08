#pragma once
// A Logger whose lines go to an anonymous temporary file that the test reads back, so a test
// can require that something was logged (e.g. a refused connection, naming its address).
// Thread-safe like any FILE*: library threads may log while the test reads.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ringfence/log.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace ringfence::test {

class CapturedLog {
 public:
  explicit CapturedLog(LogLevel level = LogLevel::Info, int rank = -1) : file_(std::tmpfile()), log_(level, rank, file_) {
    if (!file_) throw std::runtime_error("tmpfile failed");
  }
  ~CapturedLog() { std::fclose(file_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  // The logger to hand to the code under test (it must not outlive this object).
  const Logger* get() const noexcept { return &log_; }
  Logger& logger() noexcept { return log_; }

  // Everything logged so far.
  std::string text() const {
    std::fflush(file_);
    std::string out;
    char buf[4096];
    off_t at = 0;
    for (ssize_t n; (n = ::pread(::fileno(file_), buf, sizeof buf, at)) > 0; at += n) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }
  // True once a line containing every one of `parts` was logged; waits up to `patience` for
  // lines logged by other threads.
  template <class... Parts>
  bool has_line(std::chrono::milliseconds patience, const Parts&... parts) const {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      const std::string all = text();
      for (std::size_t at = 0; at < all.size();) {
        const std::size_t end = std::min(all.find('\n', at), all.size());
        const std::string_view line(all.data() + at, end - at);
        if ((... && (line.find(std::string_view(parts)) != std::string_view::npos))) return true;
        at = end + 1;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::FILE* file_;
  Logger log_;
};

}  // namespace ringfence::test
