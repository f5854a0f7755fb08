// Unit tests of the ringfence-run launcher ([launcher]): output, rendezvous, fail-fast,
// timeouts, argument errors and CPU binding. They run the ringfence-run binary found next to
// this test executable.

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ringfence/store.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace {

using namespace std::chrono_literals;
using ringfence::to_bytes;
using ringfence::to_string;
using Clock = std::chrono::steady_clock;

long long elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ringfence-run (runs the binary next to this executable)
// ---------------------------------------------------------------------------------------------

namespace {

std::string launcher_path() {
  const auto path = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ringfence-run";
  if (!std::filesystem::exists(path)) FAIL("ringfence-run not found at " << path << " (build target ringfence-run)");
  return path.string();
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

struct RunResult {
  int exit_code = -1;
  std::string output;
  long long ms = 0;
};

/// Runs `ringfence-run <args>` through the shell; `redirect` chooses which streams are captured.
RunResult run_launcher(const std::string& args, const std::string& redirect = "2>&1") {
  const std::string cmd = "'" + launcher_path() + "' " + args + " " + redirect;
  const auto start = Clock::now();
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  RunResult r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.ms = elapsed_ms(start);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has_line(const std::string& text, const std::string& line) {
  auto lines = lines_of(text);
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

}  // namespace

TEST_CASE("ringfence-run starts N ranks and passes their lines on as written, like mpirun", "[launcher]") {
  auto r = run_launcher("-n 3 sh -c 'echo hi $RINGFENCE_RANK of $RINGFENCE_WORLD_SIZE'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.output);
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"hi 0 of 3", "hi 1 of 3", "hi 2 of 3"});
  CHECK(r.ms < 1000);
  // --tag-output names the rank in front of each line.
  auto tagged = run_launcher("-n 3 --tag-output sh -c 'echo hi $RINGFENCE_RANK of $RINGFENCE_WORLD_SIZE'");
  INFO(tagged.output);
  CHECK(tagged.exit_code == 0);
  lines = lines_of(tagged.output);
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"[0] hi 0 of 3", "[1] hi 1 of 3", "[2] hi 2 of 3"});
}

TEST_CASE("ringfence-run keeps a rank's lines whole when ranks write at once", "[launcher]") {
  // Four ranks each write 200 long lines as fast as they can; every line must come out intact.
  auto r = run_launcher("-n 4 sh -c 'i=0; while [ $i -lt 200 ]; do echo \"r$RINGFENCE_RANK-$i-"
                        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-end\"; i=$((i+1)); done'");
  REQUIRE(r.exit_code == 0);
  const auto lines = lines_of(r.output);
  CHECK(lines.size() == 800);
  std::size_t intact = 0;
  for (const auto& line : lines)
    intact += line.size() > 6 && line[0] == 'r' && line.ends_with("x-end") && line.find('r', 1) == std::string::npos ? 1 : 0;
  CHECK(intact == lines.size());
}

TEST_CASE("ringfence-run --output-dir writes each rank's streams to files of its own", "[launcher]") {
  const auto dir = std::filesystem::temp_directory_path() / ("rf-launcher-out-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto r = run_launcher("-n 11 --output-dir '" + (dir / "job").string() +
                        "' sh -c 'echo out $RINGFENCE_RANK; echo err $RINGFENCE_RANK >&2; printf tail'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.empty());  // nothing on the launcher's streams
  CHECK(read(dir / "job" / "rank.00" / "stdout") == "out 0\ntail\n");
  CHECK(read(dir / "job" / "rank.10" / "stdout") == "out 10\ntail\n");
  CHECK(read(dir / "job" / "rank.10" / "stderr") == "err 10\n");
  // With --tag-output the files carry the prefix too; a second job replaces the files.
  r = run_launcher("-n 2 --tag-output --output-dir '" + (dir / "job").string() + "' sh -c 'echo again'");
  CHECK(r.exit_code == 0);
  CHECK(read(dir / "job" / "rank.1" / "stdout") == "[1] again\n");
  // A directory that cannot be made: no rank starts, and the message names the path.
  std::ofstream(dir / "file") << "x";
  r = run_launcher("-n 2 --output-dir '" + (dir / "file" / "sub").string() + "' sh -c 'echo never'");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("--output-dir: cannot create " + (dir / "file").string()));
  CHECK(r.output.find("never") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ringfence-run pads rank prefixes and keeps stdout and stderr apart", "[launcher]") {
  // Only stderr captured (stdout discarded), 11 ranks so prefixes are two digits wide.
  auto err = run_launcher("-np 11 --tag-output -- sh -c 'echo out$RINGFENCE_RANK; echo err$RINGFENCE_RANK >&2'", "2>&1 >/dev/null");
  INFO(err.output);
  CHECK(err.exit_code == 0);
  CHECK(has_line(err.output, "[00] err0"));
  CHECK(has_line(err.output, "[10] err10"));
  CHECK(err.output.find("out") == std::string::npos);
  auto out = run_launcher("-n 2 sh -c 'echo out$RINGFENCE_RANK; echo err$RINGFENCE_RANK >&2'", "2>/dev/null");
  CHECK(has_line(out.output, "out1"));
  CHECK(out.output.find("err") == std::string::npos);
}

TEST_CASE("ringfence-run flushes a partial last line and splits multi-line writes", "[launcher]") {
  auto r = run_launcher("-n 1 printf 'a\\nb\\nno newline'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(lines_of(r.output) == std::vector<std::string>{"a", "b", "no newline"});
}

TEST_CASE("ringfence-run gives every rank the same store address and a 32-hex-digit token", "[launcher]") {
  auto r = run_launcher(
      "-n 2 --tag-output sh -c 'echo $RINGFENCE_LOCAL_RANK $RINGFENCE_LOCAL_SIZE $RINGFENCE_STORE_ADDR $RINGFENCE_JOB_TOKEN'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto lines = lines_of(r.output);
  REQUIRE(lines.size() == 2);
  std::set<std::string> tails;
  for (const auto& line : lines) {
    std::istringstream in(line);
    std::string prefix, local_rank, local_size, addr, token;
    in >> prefix >> local_rank >> local_size >> addr >> token;
    CHECK(prefix == "[" + local_rank + "]");
    CHECK(local_size == "2");
    CHECK(addr.rfind("127.0.0.1:", 0) == 0);
    CHECK(addr.size() > 10);
    CHECK(token.size() == 32);
    CHECK(token.find_first_not_of("0123456789abcdef") == std::string::npos);
    tails.insert(addr + " " + token);
  }
  CHECK(tails.size() == 1);
}

// Runs inside ranks started by the next test: joins the launcher's store with the environment
// it was given and rendezvouses with the other ranks. Hidden: runs only when named.
TEST_CASE("ringfence-run rank body", "[.][launcher-child]") {
  const char* addr = std::getenv("RINGFENCE_STORE_ADDR");
  const char* token_hex = std::getenv("RINGFENCE_JOB_TOKEN");
  const char* rank_s = std::getenv("RINGFENCE_RANK");
  const char* size_s = std::getenv("RINGFENCE_WORLD_SIZE");
  REQUIRE(addr);
  REQUIRE(token_hex);
  REQUIRE(rank_s);
  REQUIRE(size_s);
  const std::string a = addr;
  const auto colon = a.rfind(':');
  REQUIRE(colon != std::string::npos);
  ringfence::JobToken token{};
  REQUIRE(std::strlen(token_hex) == 32);
  for (std::size_t i = 0; i < token.size(); ++i)
    token[i] = static_cast<std::uint8_t>(std::stoi(std::string(token_hex + 2 * i, 2), nullptr, 16));
  const int rank = std::atoi(rank_s), size = std::atoi(size_s);
  ringfence::TcpStoreClient store(a.substr(0, colon), static_cast<std::uint16_t>(std::stoi(a.substr(colon + 1))), token,
                                  2000ms);
  store.set("rank/" + std::to_string(rank), to_bytes("r" + std::to_string(rank)));
  store.add("arrived", 1);
  for (int peer = 0; peer < size; ++peer)
    REQUIRE(to_string(store.get("rank/" + std::to_string(peer), 2000ms)) == "r" + std::to_string(peer));
  std::printf("rendezvous ok\n");
}

TEST_CASE("ringfence-run ranks rendezvous through the launcher's store", "[launcher]") {
  auto r = run_launcher("-n 3 --tag-output '" + self_path() + "' '[launcher-child]'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(has_line(r.output, "[0] rendezvous ok"));
  CHECK(has_line(r.output, "[1] rendezvous ok"));
  CHECK(has_line(r.output, "[2] rendezvous ok"));
}

TEST_CASE("ringfence-run fails fast when a rank fails", "[launcher]") {
  SECTION("non-zero exit") {
    auto r = run_launcher("-n 3 sh -c 'if [ $RINGFENCE_RANK = 1 ]; then exit 3; fi; exec sleep 10'");
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK(has_line(r.output, "ringfence-run: rank 1 exited with status 3"));
    CHECK(r.ms < 1500);  // the sleeping ranks were terminated, not waited for
  }
  SECTION("killed by a signal") {
    auto r = run_launcher("-n 2 sh -c 'if [ $RINGFENCE_RANK = 0 ]; then kill -9 $$; fi; sleep 10'");
    INFO(r.output);
    CHECK(r.exit_code == 128 + 9);
    CHECK_THAT(r.output, Catch::Contains("ringfence-run: rank 0 killed by signal 9"));
    CHECK(r.ms < 1500);
  }
  SECTION("program not found") {
    auto r = run_launcher("-n 2 ringfence-no-such-program-xyz");
    INFO(r.output);
    CHECK(r.exit_code == 127);
    CHECK_THAT(r.output, Catch::Contains("cannot execute 'ringfence-no-such-program-xyz'"));
  }
}

TEST_CASE("ringfence-run --timeout kills every rank and exits 124", "[launcher]") {
  auto r = run_launcher("-n 2 --timeout 0.3 sleep 10");
  INFO(r.output);
  CHECK(r.exit_code == 124);
  CHECK_THAT(r.output, Catch::Contains("timeout"));
  CHECK(r.ms >= 250);
  CHECK(r.ms < 1500);
  // A job that finishes in time is not affected by the timeout.
  CHECK(run_launcher("--timeout 5 -n 2 true").exit_code == 0);
}

TEST_CASE("ringfence-run rejects bad arguments with exit status 2", "[launcher]") {
  for (const char* args : {"", "-n 0 true", "-n 3", "-n x true", "-n 2 --timeout abc true", "-n 2 --timeout -1 true",
                           "--frobnicate -n 2 true", "-n", "-n 2 --output-dir"}) {
    auto r = run_launcher(args);
    INFO("args: " << args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("usage: ringfence-run"));
  }
}

TEST_CASE("ringfence-run --bind-to core pins rank r to the r-th allowed CPU", "[launcher]") {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  REQUIRE(!cpus.empty());
  // Three ranks: on a 2-CPU machine the third wraps onto the first CPU (and says so once).
  auto r = run_launcher("-n 3 --bind-to core --tag-output sh -c 'grep Cpus_allowed_list /proc/self/status'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    const int cpu = cpus[static_cast<std::size_t>(rank) % cpus.size()];
    CHECK(has_line(r.output, "[" + std::to_string(rank) + "] Cpus_allowed_list:\t" + std::to_string(cpu)));
  }
  CHECK((cpus.size() >= 3) == (r.output.find("ranks share CPUs") == std::string::npos));
  // The default binds nothing: a rank may run wherever the launcher may.
  std::string own;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("Cpus_allowed_list:")) own = line;
  }
  REQUIRE(!own.empty());
  auto unbound = run_launcher("-n 2 --bind-to none --tag-output sh -c 'grep Cpus_allowed_list /proc/self/status'");
  INFO(unbound.output);
  CHECK(has_line(unbound.output, "[0] " + own));
  CHECK(has_line(unbound.output, "[1] " + own));
  CHECK(run_launcher("-n 1 --bind-to socket true").exit_code == 2);
}

TEST_CASE("ranks bound to a core each by ringfence-run --bind-to core spin long in their waits and unbound ones or RINGFENCE_SPIN=off do not",
          "[launcher]") {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  // With one CPU the launcher binds both ranks to it: no rank has a core of its own, and two
  // ranks outnumber the CPUs, where even RINGFENCE_SPIN=on keeps the short spin.
  const std::size_t spinning_if_cores = CPU_COUNT(&allowed) >= 2 ? 2 : 0;
  const std::string perf = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "all_reduce_perf").string();
  REQUIRE(std::filesystem::exists(perf));
  auto job = [&](const std::string& env, const std::string& bind, int ranks = 2) {
    auto r = run_launcher("-n " + std::to_string(ranks) + " --bind-to " + bind + " env RINGFENCE_LOG=info RINGFENCE_TRANSPORTS=shm " + env + " '" + perf +
                          "' -b 8 -e 8 -n 2 -w 1 -c 1");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    std::size_t spinning = 0;
    for (const std::string& line : lines_of(r.output)) spinning += line.find("waits spin up to") != std::string::npos;
    return spinning;
  };
  CHECK(job("", "core") == spinning_if_cores);  // both ranks, each naming its CPU and the 2048 polls
  CHECK(job("", "none") == 0);
  CHECK(job("RINGFENCE_SPIN=off", "core") == 0);
  CHECK(job("RINGFENCE_SPIN=on", "none") == spinning_if_cores);
  // More ranks than the host's online CPUs (what oversubscription counts): never, even with on.
  const int online = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (online <= 8) CHECK(job("RINGFENCE_SPIN=on", "none", online + 1) == 0);
}
