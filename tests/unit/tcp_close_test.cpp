// Closing tcp communicators whose peers live in the same process (ncclCommInitAll: several
// ranks per process) one after another on one thread, as `for (i) ncclCommDestroy(comms[i])`
// does: no close may wait for a peer that this thread only closes later (the transport's
// linger, transports/tcp/tcp_progress.cpp). Before, each close waited 10 s.
#include <chrono>
#include <memory>
#include <ringfence/communicator.hpp>
#include <ringfence/store.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using namespace ringfence;

TEST_CASE("tcp: communicators of one process closed one after another on one thread do not wait for each other",
          "[tcp][close]") {
  const int n = 3;
  auto store = std::make_shared<InProcessStore>();
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      CommOptions o;
      o.transports = {"tcp"};
      o.timeout = std::chrono::seconds(20);
      o.host_id = "tcp-close";
      comms[static_cast<std::size_t>(r)] = std::make_unique<Communicator>(store, r, n, builtin_transports(), o);
      float x = 1.0f + static_cast<float>(r);
      comms[static_cast<std::size_t>(r)]->allreduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);  // the links carried data
    });
  for (auto& t : threads) t.join();
  for (const auto& c : comms) REQUIRE(c);
  for (int r = 0; r < n; ++r) {
    const auto start = std::chrono::steady_clock::now();
    comms[static_cast<std::size_t>(r)].reset();  // its peers are still open, on this thread
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO("closing rank " << r << " took " << s << " s");
    CHECK(s < 3.0);
  }
}
