// Failure semantics (docs/failure-semantics.md) on thread ranks: invalid API use gives a clear
// error naming the argument and the rank (one case per test), mismatched calls are refused by
// the call fingerprints naming both ranks, abort() ends in-flight work in bounded time from
// another thread, the heartbeat reports a peer that closed its communicator, and per-call
// deadlines apply.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <fmt/format.h>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"

using namespace ringfence;
using Clock = std::chrono::steady_clock;

namespace {

CommOptions options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = timeout;
  o.chunk_bytes = 256;
  return o;
}

// Runs `call` on every one of 2 thread ranks and requires InvalidUsage whose message names the
// rank and contains `needle`. Returns "" or what went wrong.
std::string expect_invalid(const std::function<void(Communicator&, std::vector<float>&)>& call, const std::string& needle) {
  std::vector<std::string> seen(2);
  const std::string err = test::run_ranks(2, options(), [&](Communicator& comm) {
    std::vector<float> buf(64, 1.0f);
    try {
      call(comm, buf);
      seen[static_cast<std::size_t>(comm.rank())] = "no InvalidUsage";
    } catch (const InvalidUsage& e) {
      const std::string what = e.what();
      const bool ok = what.find(needle) != std::string::npos && what.find("rank " + std::to_string(comm.rank())) != std::string::npos;
      seen[static_cast<std::size_t>(comm.rank())] = ok ? "ok" : "message lacks '" + needle + "' or the rank: " + what;
    }
    // The communicator stays usable after an argument error (nothing was sent).
    std::vector<float> v(16, 1.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    T_CHECK(v[0] == 2.0f);
  });
  if (!err.empty()) return err;
  for (const auto& s : seen)
    if (s != "ok") return s;
  return "";
}

}  // namespace

// ---- invalid arguments: one case per test ----

TEST_CASE("misuse: a null send buffer is refused naming it", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allreduce(nullptr, b.data(), 4, DataType::Float32, ReduceOp::Sum); },
                         "sendbuff is null") == "");
}

TEST_CASE("misuse: a null receive buffer is refused naming it", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allgather(b.data(), nullptr, 4, DataType::Float32); }, "recvbuff is null") == "");
}

TEST_CASE("misuse: partly overlapping buffers are refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data() + 1, 8, DataType::Float32, ReduceOp::Sum); },
                         "overlap") == "");
}

TEST_CASE("misuse: a reduce-scatter output overlapping its input off the in-place slot is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.reduce_scatter(b.data(), b.data() + 1, 4, DataType::Float32, ReduceOp::Sum); },
                         "overlap") == "");
}

TEST_CASE("misuse: a root past the last rank is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 4, DataType::Float32, 2); },
                         "root 2 is out of range") == "");
}

TEST_CASE("misuse: a negative root is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.reduce(b.data(), b.data(), 4, DataType::Float32, ReduceOp::Sum, -1); },
                         "root -1 is out of range") == "");
}

TEST_CASE("misuse: an invalid datatype value is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, static_cast<DataType>(77), ReduceOp::Sum); },
                         "invalid datatype") == "");
}

TEST_CASE("misuse: an invalid reduce op value is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, DataType::Float32, static_cast<ReduceOp>(42)); },
                         "invalid reduce op") == "");
}

TEST_CASE("misuse: a count whose byte size overflows is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.allgather(b.data(), b.data() + 8, SIZE_MAX / 2, DataType::Float32); },
                         "overflows") == "");
}

TEST_CASE("misuse: a peer out of range is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.send(b.data(), 4, DataType::Float32, 7); }, "peer 7 is out of range") == "");
}

TEST_CASE("misuse: a send to ourselves outside a group is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto& b) { c.send(b.data(), 4, DataType::Float32, c.rank()); }, "ourselves") == "");
}

TEST_CASE("misuse: group_end without group_start is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto&) { c.group_end(); }, "no matching group_start") == "");
}

TEST_CASE("misuse: a collective inside a group is refused", "[failure][validation]") {
  REQUIRE(expect_invalid(
              [](Communicator& c, auto& b) {
                c.group_start();
                try {
                  c.allreduce(b.data(), b.data(), 4, DataType::Float32, ReduceOp::Sum);
                } catch (...) {
                  c.group_end();
                  throw;
                }
              },
              "inside group_start") == "");
}

TEST_CASE("misuse: free() of memory from another communicator is refused", "[failure][validation]") {
  // Two communicators over the same two thread ranks: memory from the first is not the second's.
  std::atomic<int> ok{0};
  auto store = std::make_shared<InProcessStore>();
  auto second = std::make_shared<InProcessStore>();
  std::vector<std::thread> threads;
  std::string error;
  std::mutex mutex;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator a(store, r, 2, builtin_transports(), options());
        Communicator b(second, r, 2, builtin_transports(), options());
        void* p = a.alloc(4096);
        try {
          b.free(p);
        } catch (const InvalidUsage& e) {
          if (std::string(e.what()).find("not returned by this communicator's alloc()") != std::string::npos) ++ok;
        }
        a.free(p);
        try {
          a.free(p);  // twice
        } catch (const InvalidUsage&) {
          ++ok;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE(error.empty());
  REQUIRE(ok == 4);
}

TEST_CASE("misuse: a moved-from communicator refuses calls instead of crashing", "[failure][validation]") {
  std::vector<std::string> seen(2);
  const std::string err = test::run_ranks(2, options(), [&](Communicator& comm) {
    Communicator taken = std::move(comm);
    std::vector<float> v(8, 1.0f);
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);  // NOLINT(bugprone-use-after-move)
      seen[static_cast<std::size_t>(taken.rank())] = "no error";
    } catch (const InvalidUsage& e) {
      seen[static_cast<std::size_t>(taken.rank())] = std::string(e.what()).find("moved from") != std::string::npos ? "ok" : e.what();
    }
    T_CHECK(comm.rank() == -1 && comm.size() == 0 && !comm.async_error().is_ok());  // NOLINT(bugprone-use-after-move)
    taken.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    T_CHECK(v[0] == 2.0f);
  });
  REQUIRE(err.empty());
  REQUIRE(seen[0] == "ok");
  REQUIRE(seen[1] == "ok");
}

TEST_CASE("misuse: a negative per-call timeout is refused", "[failure][validation]") {
  REQUIRE(expect_invalid([](Communicator& c, auto&) { c.set_timeout(std::chrono::milliseconds(-5)); }, "negative") == "");
}

// ---- call fingerprints: the ranks disagree on a call ----

namespace {
// Rank 0 runs `mine`, rank 1 runs `theirs`; both must get InvalidUsage naming both ranks and
// containing `needle`, and the communicator stays failed afterwards.
std::string expect_mismatch(const std::function<void(Communicator&, std::vector<float>&)>& mine,
                            const std::function<void(Communicator&, std::vector<float>&)>& theirs, const std::string& needle) {
  std::vector<std::string> seen(2);
  const std::string err = test::run_ranks(2, options(), [&](Communicator& comm) {
    std::vector<float> buf(1024, 1.0f);
    comm.allreduce(buf.data(), buf.data(), 8, DataType::Float32, ReduceOp::Sum);  // in step first
    const auto r = static_cast<std::size_t>(comm.rank());
    try {
      (comm.rank() == 0 ? mine : theirs)(comm, buf);
      seen[r] = "no error";
    } catch (const InvalidUsage& e) {
      const std::string what = e.what();
      const bool names = what.find("rank 0") != std::string::npos && what.find("rank 1") != std::string::npos;
      seen[r] = names && what.find(needle) != std::string::npos ? "ok" : "message: " + what;
    }
    T_CHECK(comm.async_error().code() == ErrorCode::InvalidUsage);
  });
  if (!err.empty()) return err;
  for (const auto& s : seen)
    if (s != "ok") return s;
  return "";
}
}  // namespace

TEST_CASE("fingerprints: different counts on two ranks are refused naming both", "[failure][fingerprint]") {
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
                          [](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 12, DataType::Float32, ReduceOp::Sum); },
                          "count=1") == "");
}

TEST_CASE("fingerprints: different collectives on two ranks are refused naming both", "[failure][fingerprint]") {
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
                          [](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 10, DataType::Float32, 0); },
                          "broadcast(count=10, float, root=0)") == "");
}

TEST_CASE("fingerprints: no chunk of a disagreeing call is used, though the first data leaves before the comparison",
          "[failure][fingerprint]") {
  // Rank 1 runs an allreduce: its first chunk reaches rank 0 without waiting for rank 0's
  // fingerprint. Rank 0 runs a broadcast from rank 1, whose only step copies what arrives into
  // its output: the comparison comes first, so the output keeps its old contents.
  std::vector<std::string> seen(2);
  const std::string err = test::run_ranks(2, options(), [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> buf(16, comm.rank() == 0 ? -1.0f : 7.0f);
    try {
      if (comm.rank() == 0)
        comm.broadcast(buf.data(), buf.data(), buf.size(), DataType::Float32, 1);
      else
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      seen[r] = "no error";
    } catch (const InvalidUsage& e) {
      const std::string what = e.what();
      seen[r] = what.find("disagree") != std::string::npos ? "ok" : "message: " + what;
    }
    if (comm.rank() == 0)
      for (float v : buf)
        if (v != -1.0f) seen[r] = fmt::format("the refused broadcast wrote {} into the output", v);
  });
  REQUIRE(err.empty());
  REQUIRE(seen[0] == "ok");
  REQUIRE(seen[1] == "ok");
}

TEST_CASE("fingerprints: a rank stopped by the other's abort still names the disagreement", "[failure][fingerprint]") {
  // Rank 0, the root, sends more chunks than there are slots and sleeps on a credit before
  // rank 1 arrives; rank 1 finds the disagreement first and aborts rank 0, whose wait then
  // sees the abort before it looks at rank 1's fingerprint (there by then): the error still
  // describes both calls, not just "rank 1 failed".
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 1024, DataType::Float32, 0); },
                          [](Communicator& c, auto& b) {
                            std::this_thread::sleep_for(std::chrono::milliseconds(100));
                            c.allreduce(b.data(), b.data(), 8, DataType::Float32, ReduceOp::Sum);
                          },
                          "allreduce(count=8, float, sum)") == "");
}

TEST_CASE("fingerprints: different roots are refused naming both", "[failure][fingerprint]") {
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 10, DataType::Float32, 0); },
                          [](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 10, DataType::Float32, 1); }, "root=1") == "");
}

TEST_CASE("fingerprints: two roots that only send are refused long before the timeout", "[failure][fingerprint]") {
  // Each rank is the root of its own broadcast: both send more chunks than there are slots,
  // neither receives, so each sleeps on a credit that never comes. The waits themselves must
  // look at the fingerprint that arrived meanwhile, or only the 20 s timeout would end them.
  const auto t0 = Clock::now();
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 1024, DataType::Float32, 0); },
                          [](Communicator& c, auto& b) { c.broadcast(b.data(), b.data(), 1024, DataType::Float32, 1); }, "root=1") == "");
  REQUIRE(Clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("fingerprints: different datatypes or ops are refused naming both", "[failure][fingerprint]") {
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
                          [](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Max); },
                          "max") == "");
  REQUIRE(expect_mismatch([](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
                          [](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 10, DataType::Int32, ReduceOp::Sum); },
                          "int32") == "");
}

TEST_CASE("fingerprints: every rank of a larger job fails, naming the disagreeing ranks", "[failure][fingerprint]") {
  // Rank 2 of 4 calls a different count: its neighbours refuse the call and abort the others.
  std::vector<std::string> seen(4);
  const std::string err = test::run_ranks(4, options(), [&](Communicator& comm) {
    std::vector<float> buf(64, 1.0f);
    const auto r = static_cast<std::size_t>(comm.rank());
    try {
      comm.allreduce(buf.data(), buf.data(), comm.rank() == 2 ? 9 : 8, DataType::Float32, ReduceOp::Sum);
      seen[r] = "no error";
    } catch (const InvalidUsage& e) {
      seen[r] = std::string(e.what()).find("rank 2") != std::string::npos ? "ok" : e.what();
    }
  });
  REQUIRE(err.empty());
  for (const auto& s : seen) REQUIRE(s == "ok");
}

TEST_CASE("fingerprints: with RINGFENCE_CHECK_CALLS off the calls are not compared", "[failure][fingerprint]") {
  // Same count, different op: without fingerprints the collective runs (the result is the
  // ranks' problem); with them it is refused. Shows the option really switches the check.
  CommOptions o = options();
  o.check_calls = false;
  const std::string err = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<float> v(8, 1.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, comm.rank() == 0 ? ReduceOp::Sum : ReduceOp::Max);
    T_CHECK(comm.async_error().is_ok());
  });
  REQUIRE(err.empty());
}

// ---- abort(), goodbyes, per-call deadlines ----

TEST_CASE("abort() from another thread ends an in-flight call long before the timeout", "[failure][abort]") {
  // Rank 1 never joins the allreduce (it waits for rank 0 to finish); rank 0 is aborted
  // by a watchdog thread after 100 ms, with a 30 s timeout.
  std::atomic<long long> ended_ms{-1};
  std::atomic<int> kind_ok{0}, later_ok{0};
  std::atomic<bool> done{false};
  const std::string err = test::run_ranks(2, options(std::chrono::seconds(30)), [&](Communicator& comm) {
    if (comm.rank() == 1) {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort();
    });
    std::vector<float> v(1024, 1.0f);
    const auto t0 = Clock::now();
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    } catch (const AbortedError& e) {
      ended_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      if (std::string(e.what()).find("aborted") != std::string::npos) ++kind_ok;
    }
    watchdog.join();
    try {
      comm.barrier();
    } catch (const AbortedError&) {
      ++later_ok;
    }
    T_CHECK(comm.async_error().code() == ErrorCode::Aborted);
    done = true;
  });
  REQUIRE(err.empty());
  REQUIRE(kind_ok == 1);
  REQUIRE(later_ok == 1);
  REQUIRE(ended_ms >= 0);
  REQUIRE(ended_ms < 10000);  // bounded by the abort, not by the 30 s timeout
}

TEST_CASE("abort() on one rank reaches an idle peer through the heartbeat", "[failure][abort][heartbeat]") {
  CommOptions o = options(std::chrono::seconds(30));
  o.heartbeat_interval = std::chrono::milliseconds(10);
  std::atomic<int> peer_saw{0};
  std::atomic<bool> aborted{false};
  const std::string err = test::run_ranks(2, o, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      comm.abort();
      aborted = true;
      return;  // destroying after abort() does not wait for anyone
    }
    while (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 1000 && comm.async_error().is_ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    T_CHECK(comm.async_error().code() == ErrorCode::PeerUnreachable);  // learnt while idle
    try {
      comm.barrier();
    } catch (const PeerUnreachableError& e) {
      if (std::string(e.what()).find("rank 0") != std::string::npos) ++peer_saw;
    }
  });
  REQUIRE(err.empty());
  REQUIRE(peer_saw == 1);
}

TEST_CASE("a peer that closes its communicator makes the next collective fail at once", "[failure][heartbeat]") {
  CommOptions o = options(std::chrono::seconds(30));
  o.heartbeat_interval = std::chrono::milliseconds(10);
  std::atomic<bool> closed{false};
  std::atomic<long long> took_ms{-1};
  std::atomic<int> named{0};
  const std::string err = test::run_ranks(3, o, [&](Communicator& comm) {
    if (comm.rank() == 2) {
      closed = true;
      return;  // the destructor says goodbye
    }
    while (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // many heartbeat intervals
    // Point-to-point between the two others still works.
    int x = comm.rank(), y = -1;
    comm.group_start();
    comm.send(&x, 1, DataType::Int32, 1 - comm.rank());
    comm.recv(&y, 1, DataType::Int32, 1 - comm.rank());
    comm.group_end();
    T_CHECK(y == 1 - comm.rank());
    const auto t0 = Clock::now();
    try {
      comm.barrier();
    } catch (const PeerUnreachableError& e) {
      took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      // Rank 2 is named; the other survivor may have failed first and closed too (then both
      // are: "ranks 1, 2 closed their communicators").
      const std::string what = e.what();
      if (what.find("rank 2 closed its communicator") != std::string::npos ||
          what.find(fmt::format("ranks {}, 2 closed their communicators", 1 - comm.rank())) != std::string::npos)
        ++named;
    }
  });
  REQUIRE(err.empty());
  REQUIRE(named == 2);
  REQUIRE(took_ms >= 0);
  REQUIRE(took_ms < 10000);  // refused up front, not after the 30 s timeout
}

TEST_CASE("a peer that failed, aborted the others and closed is named for its failure, not for leaving", "[failure][heartbeat]") {
  // Rank 0 runs an allreduce alone and times out; it aborts the others (idle) and destroys its
  // communicator. Their next collective must report rank 0's failure, which explains why it
  // left (8 ranks on tcp: a rank that saw only its neighbour leave blamed the neighbour).
  CommOptions o = options(std::chrono::seconds(30));
  o.heartbeat_interval = std::chrono::milliseconds(10);
  std::atomic<bool> closed{false};
  std::atomic<int> named{0};
  std::vector<std::string> seen(3);
  const std::string err = test::run_ranks(3, o, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<float> v(64, 1.0f);
      comm.set_timeout(std::chrono::milliseconds(200));
      try {
        comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
      } catch (const TimeoutError&) {
      }
      closed = true;
      return;  // the destructor says goodbye
    }
    while (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the goodbye has arrived
    try {
      comm.barrier();
      seen[static_cast<std::size_t>(comm.rank())] = "no error";
    } catch (const Error& e) {
      seen[static_cast<std::size_t>(comm.rank())] = e.what();
      if (seen[static_cast<std::size_t>(comm.rank())].find("rank 0 failed (timeout, blaming rank") != std::string::npos) ++named;
    }
  });
  REQUIRE(err.empty());
  INFO(seen[1] << " | " << seen[2]);
  REQUIRE(named == 2);
}

TEST_CASE("a rank ended by a peer's abort passes it on to a rank the peer cannot reach in time", "[failure][abort]") {
  // Signals on link 0-2 are held for 10 s. Rank 0 (200 ms deadline) fails first, waiting on
  // rank 2; its abort reaches rank 1 at once and rank 2 only after 10 s. Rank 1 fails on it and
  // must pass it on: rank 2 (3 s deadline) then names rank 0's failure long before its own
  // deadline, instead of timing out on a neighbour.
  // A ring, so rank 1 needs what rank 0 passes on and is still in the call when the abort
  // comes (a one-shot rank 1 has both inputs at once and finishes before rank 0 fails).
  CommOptions o = options(std::chrono::seconds(3));
  o.heartbeat_interval = std::chrono::milliseconds(0);  // its beats on 0-2 would be held too
  o.fault = "hold:ms=10000,link=0-2";
  o.algorithm = Algorithm::Ring;
  std::atomic<int> done{0};
  std::vector<std::string> seen(3);
  std::atomic<long long> rank2_ms{-1};
  const std::string err = test::run_ranks(3, o, [&](Communicator& comm) {
    std::vector<float> v(64, 1.0f);
    if (comm.rank() == 0) comm.set_timeout(std::chrono::milliseconds(200));
    const auto t0 = Clock::now();
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
      seen[static_cast<std::size_t>(comm.rank())] = "no error";
    } catch (const Error& e) {
      seen[static_cast<std::size_t>(comm.rank())] = e.what();
    }
    if (comm.rank() == 2) rank2_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    ++done;
    while (done < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no rank leaves early
  });
  REQUIRE(err.empty());
  INFO(seen[0] << " | " << seen[1] << " | " << seen[2]);
  CHECK(seen[0].find("timed out") != std::string::npos);
  CHECK(seen[1].find("rank 0 failed (timeout") != std::string::npos);
  CHECK(seen[2].find("rank 0 failed (timeout") != std::string::npos);
  CHECK(rank2_ms < 2000);  // the forwarded word, not rank 2's own 3 s deadline
}

TEST_CASE("set_timeout: a per-call deadline overrides the communicator's", "[failure][timeout]") {
  // Timeout 30 s; rank 0 sets 200 ms for one call that rank 1 joins late (after 3 s): that call
  // fails with TimeoutError naming the 200 ms deadline.
  std::atomic<int> ok{0};
  std::atomic<bool> failed{false};
  CommOptions o = options(std::chrono::seconds(30));
  const std::string err = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<float> v(16, 1.0f);
    if (comm.rank() == 1) {
      while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    comm.set_timeout(std::chrono::milliseconds(200));
    const auto t0 = Clock::now();
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    } catch (const TimeoutError& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      if (std::string(e.what()).find("after 200 ms") != std::string::npos && ms < 10000) ++ok;
    } catch (const PeerUnreachableError&) {  // rank 1 said goodbye first: not what this tests
    }
    failed = true;
  });
  REQUIRE(err.empty());
  REQUIRE(ok == 1);
}

TEST_CASE("a store port already in use fails rank 0 with a hint, not a hang", "[failure][launch]") {
  // Occupy a port the way another process would, then ask from_launch to host the store there.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  LaunchInfo launch;
  launch.launcher = Launcher::Torchrun;
  launch.rank = 0;
  launch.size = 2;
  launch.store_host = "127.0.0.1";
  launch.store_port = ntohs(addr.sin_port);
  launch.host_store = true;
  std::string msg;
  try {
    (void)Communicator::from_launch(launch, builtin_transports(), options(std::chrono::milliseconds(2000)));
    msg = "no error";
  } catch (const SystemError& e) {
    msg = e.what();
  }
  ::close(fd);
  INFO(msg);
  REQUIRE(msg.find("rank 0: cannot host the bootstrap store") != std::string::npos);
  REQUIRE(msg.find(fmt::format(":{}", launch.store_port)) != std::string::npos);
  REQUIRE(msg.find("RINGFENCE_STORE_ADDR") != std::string::npos);
}

TEST_CASE("a RINGFENCE_FAULT rule naming a rank outside the job is refused at setup, naming the rule", "[failure][args]") {
  CommOptions o = options();
  o.fault = "flip:rate=1e-6,link=0-9";
  const std::string err = test::run_ranks(2, o, [](Communicator&) {});
  CHECK_THAT(err, Catch::Contains("link=0-9 names a rank outside this job of 2 ranks"));
  // A rule inside the job is accepted.
  o.fault = "flip:rate=1e-9,link=0-1";
  CHECK(test::run_ranks(2, o, [](Communicator&) {}).empty());
}
