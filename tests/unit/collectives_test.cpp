// Every collective besides allreduce, end to end over shm with thread ranks: every dtype (and
// op where one applies), in place and out of place, odd counts, every root; exact results;
// nothing written outside the output; argument errors name the argument and the rank.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <cstring>
#include <ringfence/communicator.hpp>
#include <ringfence/error.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"
#include "support/collective_helpers.hpp"

using namespace ringfence;
using test::describe;
using test::Guarded;
using test::kCounts;
using test::small_chunks;

TEST_CASE("reduce_scatter is exact for every dtype, op and placement", "[engine][collectives]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {1, 2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      for (std::size_t count : kCounts)
        for (int t = 0; t < kNumDataTypes; ++t)
          for (int o = 0; o < kNumReduceOps; ++o) {
            const auto type = static_cast<DataType>(t);
            const auto op = static_cast<ReduceOp>(o);
            const std::size_t elem = size_of(type), bytes = count * elem;
            Guarded in(un * bytes), out(bytes);
            test::fill_input(type, op, comm.rank(), n, in.get(), un * count);
            comm.reduce_scatter(in.get(), out.get(), count, type, op);
            wrong += test::count_wrong(type, op, n, out.get(), count, r * count);
            wrong += out.intact() ? 0 : 1;
            // In place: the result lands in our block of the input.
            comm.reduce_scatter(in.get(), in.get() + r * bytes, count, type, op);
            wrong += test::count_wrong(type, op, n, in.get() + r * bytes, count, r * count);
            wrong += in.intact() ? 0 : 1;
          }
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("allgather is exact for every dtype and placement", "[engine][collectives]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {1, 2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      for (std::size_t count : kCounts)
        for (int t = 0; t < kNumDataTypes; ++t) {
          const auto type = static_cast<DataType>(t);
          const std::size_t bytes = count * size_of(type);
          Guarded in(bytes), out(un * bytes);
          test::fill_pattern(type, comm.rank(), in.get(), count, r * count);
          comm.allgather(in.get(), out.get(), count, type);
          for (int b = 0; b < n; ++b)
            wrong += test::count_wrong_pattern(type, b, out.get() + static_cast<std::size_t>(b) * bytes, count,
                                               static_cast<std::size_t>(b) * count);
          wrong += out.intact() ? 0 : 1;
          // In place: our block of the output is the input.
          Guarded io(un * bytes);
          test::fill_pattern(type, comm.rank(), io.get() + r * bytes, count, r * count);
          comm.allgather(io.get() + r * bytes, io.get(), count, type);
          for (int b = 0; b < n; ++b)
            wrong += test::count_wrong_pattern(type, b, io.get() + static_cast<std::size_t>(b) * bytes, count,
                                               static_cast<std::size_t>(b) * count);
          wrong += io.intact() ? 0 : 1;
        }
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("broadcast delivers the root's data from every root", "[engine][collectives]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {1, 2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      for (int root = 0; root < n; ++root)
        for (std::size_t count : kCounts)
          for (DataType type : {DataType::Int8, DataType::Float16, DataType::Float32, DataType::Float64}) {
            const std::size_t bytes = count * size_of(type);
            Guarded in(bytes), out(bytes, std::byte{0x11});
            test::fill_pattern(type, comm.rank(), in.get(), count);
            // Non-roots pass a null send buffer (only the root's is read).
            comm.broadcast(comm.rank() == root ? in.get() : nullptr, out.get(), count, type, root);
            wrong += test::count_wrong_pattern(type, root, out.get(), count);
            wrong += out.intact() ? 0 : 1;
            test::fill_pattern(type, comm.rank(), in.get(), count);
            comm.broadcast(in.get(), in.get(), count, type, root);  // in place
            wrong += test::count_wrong_pattern(type, root, in.get(), count);
          }
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("reduce is exact at every root for every dtype and op, other outputs untouched", "[engine][collectives]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {1, 2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      for (int root = 0; root < n; ++root)
        for (std::size_t count : {std::size_t{0}, std::size_t{7}, std::size_t{1031}})
          for (int t = 0; t < kNumDataTypes; ++t)
            for (int o = 0; o < kNumReduceOps; ++o) {
              const auto type = static_cast<DataType>(t);
              const auto op = static_cast<ReduceOp>(o);
              const std::size_t bytes = count * size_of(type);
              Guarded in(bytes), out(bytes, std::byte{0x11});
              test::fill_input(type, op, comm.rank(), n, in.get(), count);
              comm.reduce(in.get(), out.get(), count, type, op, root);
              if (comm.rank() == root) {
                wrong += test::count_wrong(type, op, n, out.get(), count);
              } else {
                for (std::size_t i = 0; i < bytes; ++i) wrong += out.data[i] == std::byte{0x11} ? 0 : 1;
              }
              wrong += out.intact() ? 0 : 1;
            }
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("alltoall moves block j of rank r to block r of rank j", "[engine][collectives]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {1, 2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      for (std::size_t count : kCounts)
        for (DataType type : {DataType::Uint8, DataType::BFloat16, DataType::Int32, DataType::Uint64}) {
          const std::size_t bytes = count * size_of(type);
          Guarded in(un * bytes), out(un * bytes);
          // Block j of rank r carries rank r's pattern at indices (j * n + r) * count...
          for (std::size_t j = 0; j < un; ++j) test::fill_pattern(type, comm.rank(), in.get() + j * bytes, count, (j * un + r) * count);
          comm.alltoall(in.get(), out.get(), count, type);
          // ...so block s of our output must hold rank s's pattern at (r * n + s) * count.
          for (std::size_t s = 0; s < un; ++s)
            wrong += test::count_wrong_pattern(type, static_cast<int>(s), out.get() + s * bytes, count, (r * un + s) * count);
          wrong += out.intact() ? 0 : 1;
        }
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("grouped send/recv: a ring exchange in both directions with large messages does not deadlock",
          "[engine][collectives][p2p]") {
  const bool checksum = GENERATE(false, true);
  for (int n : {2, 3, 4}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(checksum), [&](Communicator& comm) {
      const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
      const std::size_t count = 4099;  // far more than the slots hold: needs both sides progressing
      std::vector<float> to_right(count), to_left(count), from_left(count), from_right(count), self_in(count), self_out(count);
      test::fill_pattern(DataType::Float32, comm.rank(), to_right.data(), count, 0);
      test::fill_pattern(DataType::Float32, comm.rank(), to_left.data(), count, count);
      test::fill_pattern(DataType::Float32, comm.rank(), self_in.data(), count, 2 * count);
      comm.group_start();
      comm.send(to_right.data(), count, DataType::Float32, right);
      comm.send(to_left.data(), count, DataType::Float32, left);
      comm.recv(from_left.data(), count, DataType::Float32, left);
      comm.recv(from_right.data(), count, DataType::Float32, right);
      comm.send(self_in.data(), count, DataType::Float32, comm.rank());  // to ourselves, matched in the group
      comm.recv(self_out.data(), count, DataType::Float32, comm.rank());
      comm.group_end();
      // With 2 ranks left == right: the two sends to the peer arrive in call order at the two
      // receives, which is what the same checks expect.
      wrong += test::count_wrong_pattern(DataType::Float32, left, from_left.data(), count, 0);
      wrong += test::count_wrong_pattern(DataType::Float32, right, from_right.data(), count, count);
      wrong += test::count_wrong_pattern(DataType::Float32, comm.rank(), self_out.data(), count, 2 * count);
      // Ungrouped small messages: rank 0 sends first, rank 1 receives (fits the slots).
      int token = comm.rank() * 10;
      if (comm.rank() == 0) comm.send(&token, 1, DataType::Int32, 1);
      if (comm.rank() == 1) {
        comm.recv(&token, 1, DataType::Int32, 0);
        wrong += token == 0 ? 0 : 1;
      }
      comm.barrier();
    });
    INFO(describe(n, checksum));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("collectives mixed in one sequence keep the links in step, every result exact", "[engine][collectives]") {
  std::atomic<std::size_t> wrong{0};
  const std::string err = test::run_ranks(4, small_chunks(), [&](Communicator& comm) {
    const std::size_t len = 999;
    std::vector<float> a(len), b(4 * len);
    // Rank q's value at index i (small integers: every sum below is exact).
    auto v = [](int q, std::size_t i) { return static_cast<float>((i * 7 + static_cast<std::size_t>(q) * 3) % 13); };
    for (int it = 0; it < 20; ++it) {
      const int bcast_root = it % 4, reduce_root = (it + 1) % 4;
      for (std::size_t i = 0; i < len; ++i) a[i] = v(comm.rank(), i);
      comm.allgather(a.data(), b.data(), len, DataType::Float32);  // b = every rank's a, block q from rank q
      for (std::size_t k = 0; k < b.size(); ++k) wrong += b[k] == v(static_cast<int>(k / len), k % len) ? 0 : 1;
      comm.reduce_scatter(b.data(), a.data(), len, DataType::Float32, ReduceOp::Sum);  // 4 equal copies of block r
      for (std::size_t i = 0; i < len; ++i) wrong += a[i] == 4 * v(comm.rank(), i) ? 0 : 1;
      comm.broadcast(a.data(), a.data(), len, DataType::Float32, bcast_root);
      comm.alltoall(b.data(), b.data(), 0, DataType::Float32);  // empty: must keep the counters in step
      comm.allreduce(a.data(), a.data(), len, DataType::Float32, ReduceOp::Max);  // already equal everywhere
      for (std::size_t i = 0; i < len; ++i) wrong += a[i] == 4 * v(bcast_root, i) ? 0 : 1;
      std::fill(b.begin(), b.end(), -1.0f);
      comm.reduce(a.data(), b.data(), len, DataType::Float32, ReduceOp::Min, reduce_root);
      for (std::size_t i = 0; i < len; ++i) wrong += b[i] == (comm.rank() == reduce_root ? 4 * v(bcast_root, i) : -1.0f) ? 0 : 1;
    }
  });
  REQUIRE(err.empty());
  REQUIRE(wrong == 0);
}

TEST_CASE("collective argument errors name the argument and the rank", "[engine][collectives][validation]") {
  std::vector<std::string> messages(2);
  const std::string err = test::run_ranks(2, small_chunks(), [&](Communicator& comm) {
    std::vector<float> buf(64);
    auto expect = [&](const std::function<void()>& f, const std::string& needle) {
      try {
        f();
      } catch (const InvalidUsage& e) {
        const std::string what = e.what();
        if (what.find(needle) == std::string::npos || what.find("rank " + std::to_string(comm.rank())) == std::string::npos)
          throw std::runtime_error("message '" + what + "' lacks '" + needle + "'");
        return;
      }
      throw std::runtime_error("no InvalidUsage for " + needle);
    };
    expect([&] { comm.reduce_scatter(nullptr, buf.data(), 4, DataType::Float32, ReduceOp::Sum); }, "sendbuff is null");
    expect([&] { comm.reduce_scatter(buf.data(), buf.data() + 1, 4, DataType::Float32, ReduceOp::Sum); },
           "overlap without being the in-place form (recvbuff == sendbuff + rank * recvcount elements");
    expect([&] { comm.allgather(buf.data(), nullptr, 4, DataType::Float32); }, "recvbuff is null");
    expect([&] { comm.allgather(buf.data() + 1, buf.data(), 4, DataType::Float32); },
           "overlap without being the in-place form (sendbuff == recvbuff + rank * sendcount elements");
    expect([&] { comm.broadcast(buf.data(), buf.data(), 4, DataType::Float32, 2); }, "root 2 is out of range");
    expect([&] { comm.broadcast(buf.data(), buf.data(), 4, DataType::Float32, -1); }, "root -1");
    expect([&] { comm.reduce(buf.data(), buf.data(), 4, DataType::Float32, static_cast<ReduceOp>(42), 0); }, "invalid reduce op");
    expect([&] { comm.alltoall(buf.data(), buf.data(), 4, DataType::Float32); }, "overlap without being the in-place form (none for this call)");
    expect([&] { comm.alltoall(buf.data(), buf.data() + 8, SIZE_MAX / 4, DataType::Float32); }, "overflows");
    expect([&] { comm.send(buf.data(), 4, static_cast<DataType>(99), 1); }, "invalid datatype");
    expect([&] { comm.send(buf.data(), 4, DataType::Float32, 5); }, "peer 5 is out of range");
    expect([&] { comm.recv(nullptr, 4, DataType::Float32, 0); }, "buf is null");
    expect([&] { comm.send(buf.data(), 4, DataType::Float32, comm.rank()); }, "ourselves");
    expect([&] { comm.group_end(); }, "no matching group_start");
    comm.group_start();
    expect([&] { comm.allreduce(buf.data(), buf.data(), 4, DataType::Float32, ReduceOp::Sum); }, "inside group_start");
    comm.group_end();
    // Root-only buffers: non-roots may pass null.
    comm.reduce(buf.data(), comm.rank() == 0 ? buf.data() + 8 : nullptr, 4, DataType::Float32, ReduceOp::Sum, 0);
    messages[static_cast<std::size_t>(comm.rank())] = "ok";
  });
  REQUIRE(err.empty());
  REQUIRE(messages[0] == "ok");
  REQUIRE(messages[1] == "ok");
}
