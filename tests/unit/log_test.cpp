// Logging ([log]): level names in any case, the NCCL-like line format, timestamps, log files
// named with %h/%p/%r, and the error for a file that cannot be opened.
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <string>

#include "support/captured_log.hpp"
#include "support/catch.hpp"

using namespace ringfence;

namespace {
std::string host_name() {
  char h[256] = {};
  REQUIRE(::gethostname(h, sizeof h - 1) == 0);
  const std::string s = h;
  return s.substr(0, s.find('.'));
}
Environment env(const std::map<std::string, std::string>& vars) { return Environment(vars); }
// Lines of `text`. (No std::regex here: GCC 12 warns inside <regex> at -O1, the ASan build.)
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}
// True when `line` is `head`, then one or more digits (a thread id), then `tail`.
bool head_tid_tail(const std::string& line, const std::string& head, const std::string& tail) {
  if (line.size() <= head.size() + tail.size() || !line.starts_with(head) || !line.ends_with(tail)) return false;
  const std::string mid = line.substr(head.size(), line.size() - head.size() - tail.size());
  return !mid.empty() && mid.find_first_not_of("0123456789") == std::string::npos;
}
bool any_line(const std::string& text, const std::string& head, const std::string& tail) {
  for (const auto& l : lines_of(text))
    if (head_tid_tail(l, head, tail)) return true;
  return false;
}
// "2026-12-02T13:40:01.123456Z ": digits where the pattern has 9.
bool is_timestamp(const std::string& s) {
  const std::string pattern = "9999-99-99T99:99:99.999999Z ";
  if (s.size() != pattern.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (pattern[i] == '9' ? !std::isdigit(static_cast<unsigned char>(s[i])) : s[i] != pattern[i]) return false;
  return true;
}
std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("log levels parse in any case", "[log]") {
  CHECK(parse_log_level("INFO") == LogLevel::Info);
  CHECK(parse_log_level("Warn") == LogLevel::Warn);
  CHECK(parse_log_level("WARNING") == LogLevel::Warn);
  CHECK(parse_log_level("trace") == LogLevel::Trace);
  CHECK(parse_log_level("DeBuG") == LogLevel::Debug);
  CHECK_FALSE(parse_log_level("loud").has_value());
  CHECK_FALSE(parse_log_level("inf").has_value());
  CHECK_FALSE(parse_log_level("").has_value());
  CHECK(CommOptions::from_env(env({{"RINGFENCE_LOG", "INFO"}})).log_level == LogLevel::Info);
}

TEST_CASE("log lines read host:pid:tid [rank] LEVEL subsystem: message", "[log]") {
  test::CapturedLog captured(LogLevel::Info, 3);
  captured.logger().warn("fenced link {}", "0-1");
  captured.logger().with_subsystem("store").info("refused a stranger");
  captured.logger().debug("not shown at info");
  const std::string text = captured.text();
  const std::string head = host_name() + ":" + std::to_string(::getpid()) + ":";
  CHECK(any_line(text, head, " [3] WARN ringfence: fenced link 0-1"));
  CHECK(any_line(text, head, " [3] INFO store: refused a stranger"));
  CHECK(lines_of(text).size() == 2);
  CHECK(text.find("not shown") == std::string::npos);
  // No rank: no bracket. The thread id is this thread's.
  test::CapturedLog unranked(LogLevel::Warn);
  unranked.logger().error("boom");
  CHECK(unranked.text().ends_with("\n"));
  CHECK(lines_of(unranked.text()).size() == 1);
  CHECK(any_line(unranked.text(), head, " ERROR ringfence: boom"));
  CHECK(unranked.text().find(":" + std::to_string(::gettid()) + " ") != std::string::npos);
}

TEST_CASE("log timestamps are UTC to the microsecond", "[log]") {
  test::CapturedLog captured(LogLevel::Warn, 0);
  captured.logger().set_timestamps(true);
  captured.logger().warn("stamped");
  const std::string line = captured.text();
  REQUIRE(line.size() > 28);
  CHECK(is_timestamp(line.substr(0, 28)));
  CHECK(line.starts_with("20"));
  CHECK(line.ends_with(" [0] WARN ringfence: stamped\n"));
  const CommOptions o = CommOptions::from_env(env({{"RINGFENCE_LOG_TIMESTAMP", "on"}}));
  CHECK(o.log_timestamps);
  CHECK_FALSE(CommOptions{}.log_timestamps);
}

TEST_CASE("log file names expand %h, %p, %r and %%", "[log]") {
  const std::string pid = std::to_string(::getpid());
  CHECK(expand_log_path("/tmp/rf.%h.%p.%r.log", 7) == "/tmp/rf." + host_name() + "." + pid + ".7.log");
  CHECK(expand_log_path("a%%b%r%x%", -1) == "a%b-%x%");
  CHECK(expand_log_path("plain", 0) == "plain");
}

TEST_CASE("a log file is appended to by every logger that names it", "[log]") {
  const auto dir = std::filesystem::temp_directory_path() / ("rf-log-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string pattern = (dir / "job.%r.log").string();
  {
    const Logger a = make_logger(LogLevel::Info, 2, pattern);
    const Logger copy = a.with_subsystem("health");  // shares the file, outlives nothing
    a.info("first");
    copy.warn("second");
  }
  make_logger(LogLevel::Info, 2, pattern, true).info("third, later");
  const std::string text = read_file(dir / "job.2.log");
  const auto lines = lines_of(text);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].ends_with(" [2] INFO ringfence: first"));
  CHECK(lines[1].ends_with(" [2] WARN health: second"));
  CHECK(is_timestamp(lines[2].substr(0, 28)));
  CHECK(lines[2].ends_with(" [2] INFO ringfence: third, later"));
  CHECK_FALSE(std::filesystem::exists(dir / "job.%r.log"));
  // A file that cannot be opened: InvalidUsage naming the variable, the rank and the path.
  const std::string bad = (dir / "missing" / "x.log").string();
  try {
    (void)make_logger(LogLevel::Warn, 5, bad);
    FAIL("no error for " << bad);
  } catch (const InvalidUsage& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 5") && Catch::Contains("RINGFENCE_LOG_FILE") && Catch::Contains(bad) &&
                             Catch::Contains("No such file"));
  }
  // From the environment; an empty value is an error naming the variable.
  CHECK(CommOptions::from_env(env({{"RINGFENCE_LOG_FILE", pattern}})).log_file == pattern);
  CHECK_THROWS_WITH(CommOptions::from_env(env({{"RINGFENCE_LOG_FILE", ""}})), Catch::Contains("RINGFENCE_LOG_FILE"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a communicator logs to RINGFENCE_LOG_FILE, or refuses to start naming it", "[log]") {
  const auto dir = std::filesystem::temp_directory_path() / ("rf-comm-log-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CommOptions o;
  o.log_level = LogLevel::Debug;
  o.log_file = (dir / "rank%r.log").string();
  o.transports = {"shm"};
  {
    Communicator comm(std::make_shared<InProcessStore>(), 0, 1, builtin_transports(), o);
    float v = 1;
    comm.allreduce(&v, &v, 1, DataType::Float32, ReduceOp::Sum);
  }
  const std::string text = read_file(dir / "rank0.log");
  INFO(text);
  CHECK(text.find("[0] ") != std::string::npos);
  CHECK((text.find(" DEBUG ") != std::string::npos || text.find(" INFO ") != std::string::npos));
  o.log_file = (dir / "no" / "such" / "dir.log").string();
  CHECK_THROWS_WITH(Communicator(std::make_shared<InProcessStore>(), 0, 1, builtin_transports(), o),
                    Catch::Contains("RINGFENCE_LOG_FILE") && Catch::Contains("rank 0"));
  std::filesystem::remove_all(dir);
}
