// Engine + shm transport end to end with ranks as threads in one process (gloo's spawn idea):
// every dtype x op, in place and out of place, odd counts, exact results on every rank.
#include <atomic>
#include <functional>
#include <ringfence/communicator.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// Runs `body(comm)` on `n` thread ranks sharing an in-process store; rethrows the first failure.
void spawn(int n, const std::function<void(Communicator&)>& body, CommOptions options = {}) {
  auto store = std::make_shared<InProcessStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  options.host_id = "thread-host";
  options.timeout = std::chrono::seconds(20);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(store, r, n, builtin_transports(), options);
        body(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

TEST_CASE("thread ranks: allreduce is exact for every dtype, op and placement", "[engine][shm]") {
  for (int n : {1, 2, 3, 4}) {
    std::atomic<std::size_t> wrong{0};
    spawn(n, [&](Communicator& comm) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1031}}) {
        for (int t = 0; t < kNumDataTypes; ++t)
          for (int o = 0; o < kNumReduceOps; ++o) {
            const auto type = static_cast<DataType>(t);
            const auto op = static_cast<ReduceOp>(o);
            const std::size_t bytes = count * size_of(type);
            std::vector<std::byte> in(bytes + 1), out(bytes + 1, std::byte{0x5a});
            test::fill_input(type, op, comm.rank(), n, in.data(), count);
            comm.allreduce(in.data(), out.data(), count, type, op);
            wrong += test::count_wrong(type, op, n, out.data(), count);
            if (out[bytes] != std::byte{0x5a}) ++wrong;  // nothing written past the end
            test::fill_input(type, op, comm.rank(), n, out.data(), count);
            comm.allreduce(out.data(), out.data(), count, type, op);  // in place
            wrong += test::count_wrong(type, op, n, out.data(), count);
          }
      }
    }, CommOptions{.chunk_bytes = 256});  // tiny chunks: many pipeline steps and slot reuse
    INFO("ranks " << n);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("thread ranks: large float32 allreduce with default chunking", "[engine][shm]") {
  const int n = 3;
  std::atomic<std::size_t> wrong{0};
  spawn(n, [&](Communicator& comm) {
    const std::size_t count = (3u << 20) + 7;
    std::vector<float> buf(count);
    test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), count);
    comm.allreduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum);
    wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), count);
    // Links carried the data and counted it.
    std::uint64_t bytes = 0;
    for (const auto& l : comm.links()) {
      REQUIRE(l.transport == "shm");
      REQUIRE(l.state == LinkState::Up);
      bytes += l.bytes_written;
    }
    REQUIRE(bytes >= 2 * (n - 1) * (count / n) * sizeof(float));
  });
  REQUIRE(wrong == 0);
}

TEST_CASE("thread ranks: alloc() memory works and is shared", "[engine][shm]") {
  spawn(2, [&](Communicator& comm) {
    auto* p = static_cast<std::int64_t*>(comm.alloc(1000 * sizeof(std::int64_t)));
    for (int i = 0; i < 1000; ++i) p[i] = comm.rank() + i;
    comm.allreduce(p, p, 1000, DataType::Int64, ReduceOp::Sum);
    for (int i = 0; i < 1000; ++i) REQUIRE(p[i] == 1 + 2 * i);
    comm.free(p);
    REQUIRE_THROWS_AS(comm.free(p), InvalidUsage);
    comm.barrier();
  });
}

TEST_CASE("thread ranks: bad arguments name the argument and the rank", "[engine][api]") {
  spawn(2, [&](Communicator& comm) {
    float a[8] = {};
    const std::string rank = "rank " + std::to_string(comm.rank());
    auto expect = [&](const std::function<void()>& f, const char* what) {
      try {
        f();
        FAIL("expected InvalidUsage for " << what);
      } catch (const InvalidUsage& e) {
        REQUIRE_THAT(e.what(), Catch::Contains(what) && Catch::Contains(rank));
      }
    };
    expect([&] { comm.allreduce(nullptr, a, 4, DataType::Float32, ReduceOp::Sum); }, "sendbuff");
    expect([&] { comm.allreduce(a, nullptr, 4, DataType::Float32, ReduceOp::Sum); }, "recvbuff");
    expect([&] { comm.allreduce(a, a + 1, 4, DataType::Float32, ReduceOp::Sum); }, "overlap");
    expect([&] { comm.allreduce(a, a, 4, static_cast<DataType>(42), ReduceOp::Sum); }, "datatype");
    expect([&] { comm.allreduce(a, a, 4, DataType::Float32, static_cast<ReduceOp>(42)); }, "reduce op");
    expect([&] { comm.allreduce(a, a, SIZE_MAX / 2, DataType::Float32, ReduceOp::Sum); }, "overflows");
    // Argument errors leave the communicator usable.
    comm.allreduce(a, a, 8, DataType::Float32, ReduceOp::Sum);
    REQUIRE(comm.async_error().is_ok());
  });
}

TEST_CASE("communicator construction validates rank and size", "[engine][api]") {
  auto store = std::make_shared<InProcessStore>();
  REQUIRE_THROWS_AS(Communicator(store, 2, 2, builtin_transports()), InvalidUsage);
  REQUIRE_THROWS_AS(Communicator(store, 0, 0, builtin_transports()), InvalidUsage);
  REQUIRE_THROWS_AS(Communicator(store, 0, 1, builtin_transports(), CommOptions{.transports = {"nvlink"}}), InvalidUsage);
}

TEST_CASE("ranks on different hosts with only shm fail with a clear error", "[engine][api]") {
  auto store = std::make_shared<InProcessStore>();
  std::string message[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(store, r, 2, builtin_transports(),
                          CommOptions{.timeout = std::chrono::seconds(5), .host_id = "host" + std::to_string(r)});
      } catch (const Error& e) {
        message[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE_THAT(message[0], Catch::Contains("no transport reaches rank 1") && Catch::Contains("host1"));
  REQUIRE_THAT(message[1], Catch::Contains("no transport reaches rank 0"));
}

TEST_CASE("thread ranks: NCCL-style unique id bootstraps through rank 0's TCP store", "[engine][store]") {
  const UniqueId id = get_unique_id("127.0.0.1");
  const int n = 3;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  std::atomic<int> good{0};
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(id, r, n, CommOptions{.timeout = std::chrono::seconds(20), .host_id = "uid-host"});
        std::int64_t v = 10 + r;
        comm.allreduce(&v, &v, 1, DataType::Int64, ReduceOp::Sum);
        if (v == 33) ++good;
        comm.barrier();  // rank 0 (the store host) must outlive the others' setup
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  REQUIRE(good == n);
}
