/// \file ringfence_run.cpp
/// `ringfence-run`: the local (single-host) launcher.
///
///     ringfence-run -n N [--timeout SEC] [--bind-to core|none] [--tag-output] [--output-dir DIR]
///                   [--] prog args...
///
/// Generates a random job token, hosts the bootstrap `TcpStoreServer` itself on 127.0.0.1 with
/// an ephemeral port (no port race, and the store outlives every rank), then forks N ranks with
/// RINGFENCE_RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_SIZE / STORE_ADDR / JOB_TOKEN set and execs
/// `prog`. Each rank's stdout and stderr come back through pipes and are printed whole line by
/// whole line, as the rank wrote them (stdout to stdout, stderr to stderr), as under `mpirun`;
/// `--tag-output` puts `[R] ` in front, `--output-dir DIR` writes them to DIR/rank.R/stdout and
/// stderr instead (rank_output.hpp). Ranks get /dev/null as stdin.
///
/// Fail-fast: when a rank exits non-zero or by a signal, the launcher reports it, sends SIGTERM
/// to the other ranks (SIGKILL 2 s later) and exits with that rank's status (128 + signal for a
/// signal). `--timeout SEC` kills every rank after SEC seconds and exits 124. SIGINT and SIGTERM
/// sent to the launcher are forwarded to the ranks; a second one sends SIGKILL. Bad arguments
/// exit 2. Each rank runs in its own process group, so signals reach the whole process tree of a
/// rank (e.g. `sh -c '...'` and its children). When every rank is gone the launcher removes
/// the shared-memory segments whose owners died without unlinking them (SIGKILL, SIGINT).
///
/// `--bind-to core` pins rank r to the r-th CPU the launcher may run on (wrapping when ranks
/// outnumber them), as `mpirun --bind-to core` does: benchmarks then stop depending on where
/// the scheduler happens to put spinning ranks (docs/launching.md). The default is `none`.

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <ringfence/log.hpp>
#include <ringfence/store.hpp>
#include <ringfence/transports/shm.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "rank_output.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr int kMaxRanks = 4096;
constexpr auto kKillGrace = std::chrono::seconds(2);
// After the last rank is reaped (and its leftover process group killed), output is drained for
// at most this long.
constexpr auto kDrainGrace = std::chrono::seconds(1);

using ringfence::launcher::Stream;
using ringfence::launcher::write_all;

void usage(std::FILE* out) {
  std::fputs(
      "usage: ringfence-run -n N [--timeout SEC] [--bind-to core|none] [--tag-output] [--output-dir DIR]\n"
      "                     [--] prog [args...]\n"
      "  -n, -np N          number of ranks to start (1..4096)\n"
      "  --timeout SEC      kill every rank after SEC seconds (exit 124)\n"
      "  --bind-to WHAT     core: pin rank r to the r-th allowed CPU (wrapping); none (default)\n"
      "  --tag-output       put \"[rank] \" in front of every line of a rank's output\n"
      "  --output-dir DIR   write rank r's stdout and stderr to DIR/rank.r/stdout and DIR/rank.r/stderr\n"
      "                     instead of the launcher's (created as needed; r padded to the widest rank)\n"
      "  -h, --help         show this help\n"
      "Each rank gets RINGFENCE_RANK, RINGFENCE_WORLD_SIZE, RINGFENCE_LOCAL_RANK, RINGFENCE_LOCAL_SIZE,\n"
      "RINGFENCE_STORE_ADDR and RINGFENCE_JOB_TOKEN. Output is passed on whole line by whole line.\n",
      out);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "ringfence-run: %s\n", message.c_str());
  usage(stderr);
  std::exit(kExitUsage);
}

struct Args {
  int ranks = 0;
  std::optional<double> timeout_s;
  bool bind_to_core = false;
  bool tag_output = false;
  std::string output_dir;  // empty: the launcher's stdout and stderr
  std::vector<std::string> command;
};

Args parse_args(int argc, char** argv) {
  Args args;
  int i = 1;
  auto value_of = [&](std::string_view flag) -> std::string_view {
    if (i + 1 >= argc) usage_error(std::string(flag) + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (a == "-n" || a == "-np" || a == "--np") {
      std::string_view v = value_of(a);
      int n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > kMaxRanks)
        usage_error("invalid rank count '" + std::string(v) + "' (expected 1.." + std::to_string(kMaxRanks) + ")");
      args.ranks = n;
    } else if (a == "--timeout") {
      std::string v(value_of(a));
      char* end = nullptr;
      errno = 0;
      double s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(s) || s <= 0 || s > 1e9)
        usage_error("invalid --timeout '" + v + "' (expected seconds > 0)");
      args.timeout_s = s;
    } else if (a == "--bind-to") {
      const std::string_view v = value_of(a);
      if (v != "core" && v != "none") usage_error("invalid --bind-to '" + std::string(v) + "' (expected core or none)");
      args.bind_to_core = v == "core";
    } else if (a == "--tag-output") {
      args.tag_output = true;
    } else if (a == "--output-dir") {
      args.output_dir = value_of(a);
      if (args.output_dir.empty()) usage_error("--output-dir needs a directory");
    } else if (a.size() > 1 && a[0] == '-') {
      usage_error("unknown option '" + std::string(a) + "'");
    } else {
      break;  // first word of the command
    }
  }
  for (; i < argc; ++i) args.command.emplace_back(argv[i]);
  if (args.ranks == 0) usage_error("missing -n N");
  if (args.command.empty()) usage_error("missing the program to run");
  return args;
}

std::string hex(const ringfence::JobToken& token) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (auto b : token) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

struct Rank {
  pid_t pid = -1;  // also the process group id
  bool alive = false;
  Stream out;
  Stream err;
  std::string prefix;
};

std::string describe(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::sigabbrev_np(WTERMSIG(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

class Launcher {
 public:
  explicit Launcher(Args args) : args_(std::move(args)) {}
  int run();

 private:
  void build_environment(int rank, const std::string& store_addr, const std::string& token_hex,
                         std::vector<std::string>& storage) const;
  void spawn(int rank, const std::vector<std::string>& env, int devnull, std::size_t width);
  void signal_all(int sig);
  void reap();
  void read_stream(Rank& r, Stream& s);
  void start_termination(int sig);
  int alive_count() const;
  bool streams_open() const;

  Args args_;
  std::vector<int> cpus_;  // --bind-to core: the CPUs the launcher may run on, in order
  std::vector<Rank> ranks_;
  sigset_t old_mask_{};
  std::optional<int> exit_code_;  // first failure (or 124 / 128+sig) decides the exit code
  std::optional<Clock::time_point> kill_at_;
  bool timed_out_ = false;
};

void Launcher::build_environment(int rank, const std::string& store_addr, const std::string& token_hex,
                                 std::vector<std::string>& storage) const {
  static constexpr std::string_view kOwned[] = {
      "RINGFENCE_RANK=",       "RINGFENCE_WORLD_SIZE=", "RINGFENCE_LOCAL_RANK=", "RINGFENCE_LOCAL_SIZE=",
      "RINGFENCE_STORE_ADDR=", "RINGFENCE_JOB_TOKEN=",  "RINGFENCE_STORE_HOST="};
  storage.clear();
  // Pass the launcher's environment through, minus the variables this launcher owns
  // (RINGFENCE_STORE_HOST would make a rank try to host a second store).
  for (char** e = environ; e && *e; ++e) {
    std::string_view var = *e;
    bool owned = false;
    for (auto prefix : kOwned) owned = owned || var.starts_with(prefix);
    if (!owned) storage.emplace_back(var);
  }
  const std::string n = std::to_string(args_.ranks);
  storage.push_back("RINGFENCE_RANK=" + std::to_string(rank));
  storage.push_back("RINGFENCE_WORLD_SIZE=" + n);
  storage.push_back("RINGFENCE_LOCAL_RANK=" + std::to_string(rank));
  storage.push_back("RINGFENCE_LOCAL_SIZE=" + n);
  storage.push_back("RINGFENCE_STORE_ADDR=" + store_addr);
  storage.push_back("RINGFENCE_JOB_TOKEN=" + token_hex);
}

void Launcher::spawn(int rank, const std::vector<std::string>& env, int devnull, std::size_t width) {
  // Everything the child touches is prepared here: after fork() in a process with threads (the
  // store server) only async-signal-safe calls are allowed, so no setenv, no allocation.
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const auto& a : args_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string exec_error = "ringfence-run: cannot execute '" + args_.command[0] + "': ";
  cpu_set_t bind{};
  const bool binding = !cpus_.empty();
  if (binding) {
    CPU_ZERO(&bind);
    CPU_SET(cpus_[static_cast<std::size_t>(rank) % cpus_.size()], &bind);
  }

  Rank& r = ranks_[static_cast<std::size_t>(rank)];
  r.out.out_fd = 1;
  r.err.out_fd = 2;
  if (!args_.output_dir.empty()) {  // opened before the fork: a bad directory starts no rank
    ringfence::launcher::open_rank_files(args_.output_dir, rank, width, r.out.out_fd, r.err.out_fd);
    r.out.owns_out = r.err.owns_out = true;
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    // dup2 clears FD_CLOEXEC on the target; every other launcher descriptor is O_CLOEXEC.
    ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    // Ranks must start with default signal handling: the launcher blocks signals for signalfd.
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (binding) ::sched_setaffinity(0, sizeof bind, &bind);  // a plain system call: fork-safe
    ::execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] ssize_t w = ::write(2, exec_error.data(), exec_error.size());
    const char* text = ::strerrordesc_np(err);
    if (text) w = ::write(2, text, std::strlen(text));
    w = ::write(2, "\n", 1);
    ::_exit(err == ENOENT ? 127 : 126);
  }
  // Also set the group from the parent, so a signal sent before the child ran setpgid still
  // reaches the right group.
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  r.pid = pid;
  r.alive = true;
  r.out.fd = out_pipe[0];
  r.err.fd = err_pipe[0];
}

void Launcher::signal_all(int sig) {
  for (auto& r : ranks_)
    if (r.alive) ::kill(-r.pid, sig);
}

void Launcher::start_termination(int sig) {
  signal_all(sig);
  if (!kill_at_) kill_at_ = Clock::now() + kKillGrace;
}

int Launcher::alive_count() const {
  int n = 0;
  for (const auto& r : ranks_) n += r.alive ? 1 : 0;
  return n;
}

bool Launcher::streams_open() const {
  for (const auto& r : ranks_)
    if (r.out.fd >= 0 || r.err.fd >= 0) return true;
  return false;
}

void Launcher::read_stream(Rank& r, Stream& s) {
  char buf[16384];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    s.finish(r.prefix);
    return;
  }
  s.partial.append(buf, static_cast<std::size_t>(n));
  s.emit(r.prefix, false);
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      if (r.pid != pid || !r.alive) continue;
      r.alive = false;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // Only the first failure is reported and decides the exit code; ranks that die after the
      // launcher started killing them are consequences, not causes.
      if (failed && !exit_code_ && !timed_out_) {
        std::string msg = "ringfence-run: rank " + std::to_string(i) + " " + describe(status) + "\n";
        write_all(2, msg);
        exit_code_ = exit_code_of(status);
        start_termination(SIGTERM);
      }
    }
  }
}

int Launcher::run() {
  // Block the signals we handle before any thread exists (the store server thread inherits the
  // mask), so they are only ever consumed through the signalfd below.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  if (::sigprocmask(SIG_BLOCK, &mask, &old_mask_) != 0) throw std::runtime_error("sigprocmask failed");
  // A closed stdout (`ringfence-run ... | head`) must not kill the launcher and orphan the ranks.
  ::signal(SIGPIPE, SIG_IGN);
  int sfd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));

  const ringfence::JobToken token = ringfence::random_token();
  // Refused and evicted store connections (strangers, floods) are logged, a few lines per 10 s.
  const ringfence::Logger store_log = ringfence::Logger(ringfence::LogLevel::Warn).with_subsystem("ringfence-run store");
  ringfence::TcpStoreServer store(token, "127.0.0.1", 0, {}, &store_log);
  const std::string store_addr = "127.0.0.1:" + std::to_string(store.port());
  const std::string token_hex = hex(token);

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) throw std::runtime_error(std::string("open /dev/null: ") + std::strerror(errno));

  if (args_.bind_to_core) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0)
      throw std::runtime_error(std::string("sched_getaffinity: ") + std::strerror(errno));
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus_.push_back(c);
    if (static_cast<std::size_t>(args_.ranks) > cpus_.size())
      write_all(2, "ringfence-run: --bind-to core: " + std::to_string(args_.ranks) + " ranks on " + std::to_string(cpus_.size()) +
                       " CPUs; ranks share CPUs (rank r on CPU r mod " + std::to_string(cpus_.size()) + ")\n");
  }
  const std::size_t width = std::to_string(args_.ranks - 1).size();
  ranks_.resize(static_cast<std::size_t>(args_.ranks));
  const auto started = Clock::now();
  std::vector<std::string> env;
  for (int i = 0; i < args_.ranks; ++i) {
    std::string rank = std::to_string(i);
    ranks_[static_cast<std::size_t>(i)].prefix = ringfence::launcher::line_prefix(args_.tag_output, i, width);
    build_environment(i, store_addr, token_hex, env);
    try {
      spawn(i, env, devnull, width);
    } catch (const std::exception& e) {
      write_all(2, std::string("ringfence-run: cannot start rank ") + rank + ": " + e.what() + "\n");
      exit_code_ = 1;
      start_termination(SIGTERM);
      ranks_.resize(static_cast<std::size_t>(i));
      break;
    }
  }
  ::close(devnull);
  // time_point::max() = no timeout (a plain value rather than an optional keeps g++ 12's
  // -Wmaybe-uninitialized quiet).
  const Clock::time_point timeout_at =
      args_.timeout_s
          ? started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*args_.timeout_s))
          : Clock::time_point::max();
  int forwarded = 0;
  std::optional<Clock::time_point> drain_until;

  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  for (;;) {
    const auto now = Clock::now();
    if (alive_count() == 0) {
      if (!streams_open()) break;
      if (!drain_until) {
        // Every rank has exited but a pipe is still open: a descendant (e.g. a background job of
        // `sh -c`) outlived its rank. Kill what is left of those ranks' process groups so no
        // orphan of the job survives the launcher.
        for (const auto& r : ranks_)
          if (r.out.fd >= 0 || r.err.fd >= 0) ::kill(-r.pid, SIGKILL);
        drain_until = now + kDrainGrace;
      }
      if (now >= *drain_until) break;  // a grandchild still holds a pipe open: stop waiting
    }
    if (!timed_out_ && now >= timeout_at && alive_count() > 0) {
      timed_out_ = true;
      write_all(2, "ringfence-run: timeout after " + std::to_string(*args_.timeout_s) + " s; killing " +
                       std::to_string(alive_count()) + " rank(s)\n");
      start_termination(SIGTERM);
    }
    if (kill_at_ && now >= *kill_at_) {
      signal_all(SIGKILL);
      kill_at_ = now + kKillGrace;  // repeat for stragglers that were stopped or are in D state
    }

    fds.clear();
    owners.clear();
    fds.push_back({sfd, POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (auto& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
    }
    auto wake = Clock::time_point::max();
    if (!timed_out_) wake = std::min(wake, timeout_at);
    if (kill_at_) wake = std::min(wake, *kill_at_);
    if (drain_until) wake = std::min(wake, *drain_until);
    int timeout_ms = -1;
    if (wake != Clock::time_point::max())
      timeout_ms =
          static_cast<int>(std::max<long long>(1, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    }
    // Output first, so a rank's last lines are printed before the report of its exit.
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second);
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(sfd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        // Forward the first INT/TERM/HUP; a second one means "now".
        ++forwarded;
        if (forwarded == 1) {
          signal_all(sig);
          if (!exit_code_) exit_code_ = 128 + sig;
        } else {
          signal_all(SIGKILL);
        }
      }
    }
    reap();
  }
  store.stop();
  ::close(sfd);
  // Ranks killed (by SIGKILL, or by a forwarded SIGINT/SIGTERM they did not handle) leave their
  // shared-memory segments behind; every owner is gone now, so their owner locks are free.
  const std::size_t swept = ringfence::transports::shm::remove_stale_segments();
  if (swept > 0 && exit_code_.value_or(0) != 0)
    write_all(2, "ringfence-run: removed " + std::to_string(swept) + " shared-memory segment(s) the ranks left behind\n");
  for (auto& r : ranks_)
    for (Stream* s : {&r.out, &r.err}) s->finish(r.prefix);
  if (timed_out_) return kExitTimeout;
  return exit_code_.value_or(0);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  try {
    Launcher launcher(std::move(args));
    return launcher.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringfence-run: %s\n", e.what());
    return 1;
  }
}
