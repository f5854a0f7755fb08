// Engine + shm transport end to end with ranks as threads in one process (gloo's spawn idea):
// every dtype x op, in place and out of place, odd counts, exact results on every rank.
#include <atomic>
#include <stdexcept>
#include <string>
#include <functional>
#include <ringfence/communicator.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
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
  // Staging only; then final values written straight into outputs (alloc()ed and, by
  // cross-memory attach, user buffers) from the smallest sizes on.
  const auto direct = GENERATE(false, true);
  CommOptions options{.chunk_bytes = 256};  // tiny chunks: many pipeline steps and slot reuse
  if (direct) {
    options.direct_write_min_bytes = 1;
    options.direct_write_user_min_bytes = 1;
  } else {
    options.direct_write_min_bytes = SIZE_MAX;
  }
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
    }, options);
    INFO("ranks " << n << " direct " << direct);
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
      T_CHECK(l.transport == "shm");
      T_CHECK(l.state == LinkState::Up);
      bytes += l.bytes_written;
    }
    T_CHECK(bytes >= 2 * (n - 1) * (count / n) * sizeof(float));
  });
  T_CHECK(wrong == 0);
}

TEST_CASE("thread ranks: alloc() memory works and is shared", "[engine][shm]") {
  CommOptions options;
  options.direct_write_min_bytes = 64;  // exercise the direct path into alloc()ed outputs
  spawn(3, [&](Communicator& comm) {
    auto* p = static_cast<std::int64_t*>(comm.alloc(1000 * sizeof(std::int64_t)));
    for (int i = 0; i < 1000; ++i) p[i] = comm.rank() + i;
    comm.allreduce(p, p, 1000, DataType::Int64, ReduceOp::Sum);
    for (int i = 0; i < 1000; ++i) T_CHECK(p[i] == 3 + 3 * i);
    // Mixed: this rank's output in alloc()ed memory, a neighbour's in user memory.
    std::vector<std::int64_t> user(1000, 1);
    std::int64_t* out = comm.rank() == 1 ? user.data() : p;
    std::fill(out, out + 1000, 1);
    comm.allreduce(out, out, 1000, DataType::Int64, ReduceOp::Sum);
    for (int i = 0; i < 1000; ++i) T_CHECK(out[i] == 3);
    comm.free(p);
    bool threw = false;
    try {
      comm.free(p);
    } catch (const InvalidUsage&) {
      threw = true;
    }
    T_CHECK(threw);
    // A new allocation (possibly at the same address) must not reuse the freed buffer's key.
    auto* q = static_cast<std::int64_t*>(comm.alloc(1000 * sizeof(std::int64_t)));
    std::fill(q, q + 1000, comm.rank());
    comm.allreduce(q, q, 1000, DataType::Int64, ReduceOp::Sum);
    for (int i = 0; i < 1000; ++i) T_CHECK(q[i] == 3);
    comm.free(q);
    comm.barrier();
  }, options);
}

TEST_CASE("thread ranks: bad arguments name the argument and the rank", "[engine][api]") {
  spawn(2, [&](Communicator& comm) {
    float a[8] = {};
    const std::string rank = "rank " + std::to_string(comm.rank());
    auto expect = [&](const std::function<void()>& f, const char* what) {
      try {
        f();
      } catch (const InvalidUsage& e) {
        const std::string msg = e.what();
        T_CHECK(msg.find(what) != std::string::npos && msg.find(rank) != std::string::npos);
        return;
      }
      throw std::runtime_error(std::string("expected InvalidUsage for ") + what);
    };
    expect([&] { comm.allreduce(nullptr, a, 4, DataType::Float32, ReduceOp::Sum); }, "sendbuff");
    expect([&] { comm.allreduce(a, nullptr, 4, DataType::Float32, ReduceOp::Sum); }, "recvbuff");
    expect([&] { comm.allreduce(a, a + 1, 4, DataType::Float32, ReduceOp::Sum); }, "overlap");
    expect([&] { comm.allreduce(a, a, 4, static_cast<DataType>(42), ReduceOp::Sum); }, "datatype");
    expect([&] { comm.allreduce(a, a, 4, DataType::Float32, static_cast<ReduceOp>(42)); }, "reduce op");
    expect([&] { comm.allreduce(a, a, SIZE_MAX / 2, DataType::Float32, ReduceOp::Sum); }, "overflows");
    // Argument errors leave the communicator usable.
    comm.allreduce(a, a, 8, DataType::Float32, ReduceOp::Sum);
    T_CHECK(comm.async_error().is_ok());
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
                          CommOptions{.timeout = std::chrono::seconds(5), .transports = {"shm"}, .host_id = "host" + std::to_string(r)});
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
