// One cell of the fault matrix (tests/mp/fault_matrix.sh): started by ringfence-run with N
// ranks, it injects one fault at one moment and checks that every surviving rank ends in an exact
// result or a clear error within the bound (2 x RINGFENCE_TIMEOUT_MS from the fault).
//
//   fault_cell <fault> <when>
//     fault: kill     the last rank is SIGKILLed
//            stop     the last rank is SIGSTOPped (a hung process; killed after the cell)
//            close    the connection between the last two ranks is closed (during: by the fault
//                     injector at a write, RINGFENCE_FAULT=close:...; between: the last rank
//                     destroys its communicator and stays alive)
//            corrupt  the link between the last two ranks flips bits (RINGFENCE_FAULT=flip:...,
//                     checksums on): results must stay exact
//            drop     the link loses writes (RINGFENCE_FAULT=drop:..., checksums on): exact
//     when:  during   the fault hits while the ranks are inside collectives
//            between  the fault hits while the ranks are idle between collectives (kill, stop,
//                     close); for corrupt and drop the link turns bad while idle (at_ms) and the
//                     collectives after the pause must stay exact
// The driver sets RINGFENCE_TIMEOUT_MS, RINGFENCE_TRANSPORTS and, for close/corrupt/drop,
// RINGFENCE_FAULT / RINGFENCE_CHECKSUM. Each rank prints one line
//   "cell rank R: <outcome> after <ms> ms (bound <ms> ms) ok|FAIL: <detail>"
// and exits 1 when its outcome breaks the cell's expectation.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

using namespace ringfence;
using Clock = std::chrono::steady_clock;

namespace {

long long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Inputs whose sums are exact in any order: small integers in float.
void fill(std::vector<float>& v, int rank, int round) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(round)) % 13);
}
bool exact(const std::vector<float>& v, int size, int round) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 3 + static_cast<std::size_t>(round)) % 13);
    if (v[i] != want) return false;
  }
  return true;
}

// kill/stop: the victim runs as a child of a small watcher, so the launcher sees the watcher's
// clean exit instead of a rank killed by a signal (which would make it stop the survivors).
// A stopped child is killed once the survivors have had their bound.
void become_watched(std::chrono::milliseconds timeout) {
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (child == 0) return;
  const auto deadline = Clock::now() + 4 * timeout + std::chrono::seconds(2);
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(child, &status, WUNTRACED | WNOHANG);
    if (got == child && (WIFEXITED(status) || WIFSIGNALED(status))) std::_Exit(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
    if (Clock::now() >= deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      std::_Exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

// "rank 3", or 3 in a list such as "ranks 0, 3 closed their communicators" (a survivor that
// failed and closed first is named beside the victim by a rank that starts its call later).
namespace {
bool names_rank(const char* what, int r) {
  const std::string text = what, num = std::to_string(r);
  const auto digit = [&](std::size_t at) { return at < text.size() && std::isdigit(static_cast<unsigned char>(text[at])) != 0; };
  for (std::size_t at = text.find("rank"); at != std::string::npos; at = text.find("rank", at + 4)) {
    std::size_t p = at + 4;
    if (p < text.size() && text[p] == 's') ++p;
    if (p >= text.size() || text[p] != ' ') continue;
    for (++p;;) {  // a number, then ", " and the next one
      if (text.compare(p, num.size(), num) == 0 && !digit(p + num.size())) return true;
      while (digit(p)) ++p;
      if (text.compare(p, 2, ", ") != 0 || !digit(p + 2)) break;
      p += 2;
    }
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fault_cell kill|stop|close|corrupt|drop during|between\n");
    return 2;
  }
  const std::string fault = argv[1], when = argv[2];
  const bool during = when == "during";
  const char* rank_env = std::getenv("RINGFENCE_RANK");
  const char* size_env = std::getenv("RINGFENCE_WORLD_SIZE");
  const int my_rank = rank_env ? std::atoi(rank_env) : -1;
  const int victim = size_env ? std::atoi(size_env) - 1 : -1;
  try {
    const auto timeout = CommOptions::from_env().timeout;
    const long long bound = 2 * timeout.count();
    if ((fault == "kill" || fault == "stop") && my_rank == victim) become_watched(timeout);

    std::optional<Communicator> comm(Communicator::from_env());
    const int rank = comm->rank(), size = comm->size();
    std::vector<float> buf(64 * 1024);
    auto verified_allreduce = [&](int round) {
      fill(buf, rank, round);
      comm->allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      return exact(buf, size, round);
    };
    if (!verified_allreduce(0)) {
      std::printf("cell rank %d: wrong result in the warm-up FAIL\n", rank);
      return 1;
    }
    const bool data_fault = fault == "corrupt" || fault == "drop";
    auto report = [&](const char* outcome, long long ms, bool ok, const std::string& detail) {
      std::printf("cell rank %d: %s after %lld ms (bound %lld ms) %s: %s\n", rank, outcome, ms, bound, ok ? "ok" : "FAIL",
                  detail.c_str());
      std::fflush(stdout);
      // Survivors stay a little, so a rank that notices later does not see this one's exit
      // first (that would be a second failure, reported instead of the injected one).
      if (!data_fault) std::this_thread::sleep_for(timeout / 2);
      return ok ? 0 : 1;
    };
    const std::string victim_name = "rank " + std::to_string(victim);

    if (data_fault) {
      // The link is bad from the start (during) or turns bad at at_ms while every rank idles
      // (between; the driver sets at_ms below the pause). Every result must stay exact.
      comm->barrier();
      if (!during) {
        std::this_thread::sleep_for(2 * timeout);
        if (!comm->async_error().is_ok()) return report("error while idle", 0, false, "the heartbeat misfired on an idle bad link");
      }
      const auto t0 = Clock::now();
      try {
        for (int round = 1; round <= 24; ++round)
          if (!verified_allreduce(round)) return report("WRONG RESULT", ms_since(t0), false, "round " + std::to_string(round));
      } catch (const Error& e) {
        // Even two ranks, with no route around the bad link, keep it in use with checksums.
        return report("error", ms_since(t0), false, e.what());
      }
      std::uint64_t corrupted = 0;
      for (const auto& l : comm->links()) corrupted += l.checksum_errors;
      return report("exact", ms_since(t0), true,
                    "24 verified allreduces; " + std::to_string(corrupted) + " bad chunks caught here, " +
                        std::to_string(comm->fenced_links().size()) + " link(s) fenced");
    }

    // kill, stop, close: every survivor must end in a clear error naming the cause in time.
    comm->barrier();
    if (rank == victim && fault != "close") {
      const int sig = fault == "kill" ? SIGKILL : SIGSTOP;
      if (!during) ::raise(sig);
      std::thread([sig] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ::raise(sig);
      }).detach();
      for (int round = 1;; ++round) (void)verified_allreduce(round);
    }
    if (fault == "close" && !during && rank == victim) {
      comm.reset();  // closes every connection of this rank; the process stays
      std::this_thread::sleep_for(3 * timeout);
      std::printf("cell rank %d: closed its communicator and stayed alive ok: victim\n", rank);
      return 0;
    }
    const auto t0 = Clock::now();
    auto judge = [&](const Error& e, long long ms) {
      const bool kind_ok = e.code() == ErrorCode::PeerUnreachable || e.code() == ErrorCode::Timeout ||
                           (fault == "close" && e.code() == ErrorCode::Fenced);
      // close: the two ends of the closed link each name the other; everyone else names one of them.
      const bool names = names_rank(e.what(), victim) || (fault == "close" && names_rank(e.what(), victim - 1));
      // Destroying a communicator after an error must not wait for the dead or stopped peer.
      const auto before_destroy = Clock::now();
      comm.reset();
      const long long destroy_ms = ms_since(before_destroy);
      const std::string detail = std::string(e.what()) + " [destroyed in " + std::to_string(destroy_ms) + " ms]";
      return report(to_string(e.code()).data(), ms, kind_ok && names && ms <= bound && destroy_ms <= bound, detail);
    };
    if (!during) {
      // Idle: the heartbeat must notice (kill, stop) and the next call must fail at once.
      long long noticed = -1;
      while (ms_since(t0) < (fault == "close" ? timeout.count() / 2 : 3 * timeout.count())) {
        if (!comm->async_error().is_ok()) {
          noticed = ms_since(t0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      // close: a clean goodbye is not an error by itself (point-to-point between others may go
      // on), but the next collective must fail at once naming the rank that left.
      if (fault != "close" && noticed < 0) return report("nothing", ms_since(t0), false, "no async_error() while idle");
      const auto t1 = Clock::now();
      try {
        (void)verified_allreduce(1);
        return report("no error", ms_since(t1), false, "a collective succeeded without " + victim_name);
      } catch (const Error& e) {
        return judge(e, fault == "close" ? ms_since(t1) : noticed);
      }
    }
    try {
      for (int round = 1; round <= 100000; ++round)
        if (!verified_allreduce(round)) return report("WRONG RESULT", ms_since(t0), false, "round " + std::to_string(round));
      return report("no error", ms_since(t0), false, "the fault never surfaced");
    } catch (const Error& e) {
      return judge(e, ms_since(t0));
    }
  } catch (const std::exception& e) {
    std::printf("cell rank %d: unexpected error FAIL: %s\n", my_rank, e.what());
    return 1;
  }
}
