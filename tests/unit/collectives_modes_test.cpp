// The collectives beyond their plain schedules, end to end over shm with thread ranks: async
// calls, tree, direct and one-shot allreduce, shrink and split, direct writes into receive and
// output buffers, parallel channels, and ranks on two hosts; exact results throughout.
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
using test::kGuard;
using test::kCounts;
using test::small_chunks;

TEST_CASE("async collectives run in issue order and overlap with the caller", "[engine][collectives][async]") {
  for (int n : {1, 2, 3, 4}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, small_chunks(), [&](Communicator& comm) {
      const std::size_t count = 3001;
      constexpr int kCalls = 8;
      std::vector<std::vector<float>> in(kCalls, std::vector<float>(count)), out(kCalls, std::vector<float>(count));
      std::vector<Work> works;
      for (int i = 0; i < kCalls; ++i) {
        test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in[static_cast<std::size_t>(i)].data(), count);
        works.push_back(comm.allreduce_async(in[static_cast<std::size_t>(i)].data(), out[static_cast<std::size_t>(i)].data(), count,
                                             DataType::Float32, ReduceOp::Sum));
      }
      // Order: a reduce into `acc` then a broadcast of `acc`, both queued, then a blocking
      // allgather that must see the broadcast's result.
      std::vector<float> acc(count, -1.0f), gathered(count * static_cast<std::size_t>(n));
      std::vector<float> mine(count);
      test::fill_input(DataType::Float32, ReduceOp::Max, comm.rank(), n, mine.data(), count);
      Work r = comm.reduce_async(mine.data(), acc.data(), count, DataType::Float32, ReduceOp::Max, n - 1);
      Work b = comm.broadcast_async(acc.data(), acc.data(), count, DataType::Float32, n - 1);
      Work barrier = comm.barrier_async();
      comm.allgather(acc.data(), gathered.data(), count, DataType::Float32);  // blocking: runs after the queue
      T_CHECK(r.test() && b.test() && barrier.test());
      for (auto& w : works) w.wait();
      r.wait();
      b.wait();
      barrier.wait();
      for (int i = 1; i < kCalls; ++i) wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out[static_cast<std::size_t>(i)].data(), count);
      for (int s = 0; s < n; ++s)
        wrong += test::count_wrong(DataType::Float32, ReduceOp::Max, n, gathered.data() + static_cast<std::size_t>(s) * count, count);
      comm.synchronize();
    });
    INFO("ranks " << n);
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("async: wait_for times out while a peer is late, then completes", "[engine][collectives][async]") {
  std::atomic<int> early{0};
  const std::string err = test::run_ranks(2, small_chunks(), [&](Communicator& comm) {
    int value = comm.rank() + 1;
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Work w = comm.allreduce_async(&value, &value, 1, DataType::Int32, ReduceOp::Sum);
    if (comm.rank() == 0 && !w.wait_for(std::chrono::milliseconds(20))) ++early;
    T_CHECK(w.wait_for(std::chrono::seconds(10)));
    T_CHECK(w.test());
    T_CHECK(value == 3);
  });
  REQUIRE(err.empty());
  REQUIRE(early == 1);
}

TEST_CASE("async: a peer that never joins turns into an error at wait(), and later calls fail fast",
          "[engine][collectives][async]") {
  CommOptions o = small_chunks();
  o.timeout = std::chrono::milliseconds(300);
  std::atomic<int> timeouts{0}, fast{0};
  const std::string err = test::run_ranks(2, o, [&](Communicator& comm) {
    if (comm.rank() == 1) return;  // leaves without taking part
    int value = 1;
    Work w = comm.allreduce_async(&value, &value, 1, DataType::Int32, ReduceOp::Sum);
    Work later = comm.allreduce_async(&value, &value, 1, DataType::Int32, ReduceOp::Sum);
    try {
      w.wait();
    } catch (const Error& e) {
      if (e.code() == ErrorCode::Timeout || e.code() == ErrorCode::PeerUnreachable) ++timeouts;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      later.wait();
    } catch (const Error&) {
      if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200)) ++fast;
    }
    T_CHECK(!comm.async_error().is_ok());
  });
  REQUIRE(err.empty());
  REQUIRE(timeouts == 1);
  REQUIRE(fast == 1);
}

TEST_CASE("tree, direct and one-shot allreduce are exact for every dtype, op and placement", "[engine][collectives][tree][direct]") {
  const bool checksum = GENERATE(false, true);
  const Algorithm algo = GENERATE(Algorithm::Tree, Algorithm::Direct, Algorithm::OneShot);
  for (int n : {2, 3, 4, 5, 8}) {
    CommOptions o = small_chunks(checksum);
    o.algorithm = algo;
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      for (std::size_t count : kCounts)
        for (int t = 0; t < kNumDataTypes; ++t)
          for (int op_i = 0; op_i < kNumReduceOps; ++op_i) {
            const auto type = static_cast<DataType>(t);
            const auto op = static_cast<ReduceOp>(op_i);
            const std::size_t bytes = count * size_of(type);
            Guarded in(bytes), out(bytes);
            test::fill_input(type, op, comm.rank(), n, in.get(), count);
            comm.allreduce(in.get(), out.get(), count, type, op);
            wrong += test::count_wrong(type, op, n, out.get(), count) + (out.intact() ? 0 : 1);
            comm.allreduce(in.get(), in.get(), count, type, op);  // in place
            wrong += test::count_wrong(type, op, n, in.get(), count) + (in.intact() ? 0 : 1);
          }
    });
    INFO(describe(n, checksum) << " algo " << static_cast<int>(algo));
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("every algorithm gives every rank the same bits where operand order shows: signed zeros under min and max",
          "[engine][collectives][oneshot][order]") {
  // min(+0, -0) is its first operand, so a rank that combined two inputs the other way round
  // would hold a zero of the other sign: the schedules must have every rank compute the same
  // expression, not merely combine the same inputs.
  const bool checksum = GENERATE(false, true);
  const Algorithm algo = GENERATE(Algorithm::Ring, Algorithm::Tree, Algorithm::Direct, Algorithm::OneShot);
  for (int n : {2, 3, 4}) {
    CommOptions o = small_chunks(checksum);
    o.chunk_bytes = 4096;  // one-shot takes messages of up to a slot
    o.algorithm = algo;
    const std::size_t count = 1000;
    std::vector<std::vector<std::uint32_t>> bits(static_cast<std::size_t>(2 * n));  // [op * n + rank]
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      const int r = comm.rank();
      for (int k = 0; k < 2; ++k) {
        std::vector<float> in(count), out(count, 1.0f);
        for (std::size_t i = 0; i < count; ++i) in[i] = (i >> r) & 1 ? -0.0f : 0.0f;  // every sign pattern over the ranks
        comm.allreduce(in.data(), out.data(), count, DataType::Float32, k == 0 ? ReduceOp::Min : ReduceOp::Max);
        auto& mine = bits[static_cast<std::size_t>(k * n + r)];
        mine.resize(count);
        std::memcpy(mine.data(), out.data(), count * sizeof(float));
      }
    });
    INFO(describe(n, checksum) << " algo " << static_cast<int>(algo));
    REQUIRE(err.empty());
    for (int k = 0; k < 2; ++k)
      for (int r = 0; r < n; ++r) {
        INFO((k == 0 ? "min" : "max") << ", rank " << r);
        const auto& mine = bits[static_cast<std::size_t>(k * n + r)];
        REQUIRE(std::all_of(mine.begin(), mine.end(), [](std::uint32_t b) { return (b & 0x7fffffffu) == 0; }));  // zeros
        REQUIRE(mine == bits[static_cast<std::size_t>(k * n)]);
      }
  }
}

TEST_CASE("tree, direct and one-shot allreduce: corrupted chunks are re-sent, a fenced link sends allreduce back to the ring",
          "[engine][collectives][tree][direct][fault]") {
  const bool agree = GENERATE(false, true);
  const Algorithm algo = GENERATE(Algorithm::Tree, Algorithm::Direct, Algorithm::OneShot);
  CommOptions o = small_chunks(true);
  o.algorithm = algo;
  o.fault = "flip:rate=1e-3,link=0-1,seed=3";  // link 0-1 is an edge of the second tree at 4 ranks
  o.health_agree_every = agree ? 2 : 0;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  std::atomic<std::size_t> wrong{0}, fenced{0}, errors{0};
  const std::string err = test::run_ranks(4, o, [&](Communicator& comm) {
    std::vector<float> in(20000), out(20000);
    for (int it = 0; it < 12; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 4, in.data(), in.size());
      comm.allreduce(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 4, out.data(), out.size());
    }
    fenced += comm.fenced_links().size();
    for (const auto& l : comm.links()) errors += l.checksum_errors;
  });
  INFO("agree " << agree << " algo " << static_cast<int>(algo));
  REQUIRE(err.empty());
  REQUIRE(wrong == 0);
  REQUIRE(errors > 0);                         // the fault hit tree traffic and was repaired
  REQUIRE(fenced == (agree ? 4u : 0u));        // every rank fenced 0-1 (and then ran the ring)
}

TEST_CASE("shrink: survivors of a departed rank build a smaller communicator and keep fences", "[engine][shrink]") {
  CommOptions o = small_chunks(true);
  o.fault = "flip:rate=1e-3,link=0-1,seed=3";  // gets 0-1 fenced before the shrink
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  std::atomic<std::size_t> wrong{0}, ok{0};
  const std::string err = test::run_ranks(4, o, [&](Communicator& comm) {
    std::vector<float> buf(20000);
    for (int it = 0; it < 6; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 4, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 4, buf.data(), buf.size());
    }
    T_CHECK(comm.fenced_links().size() == 1);
    if (comm.rank() == 2) return;  // leaves (its communicator is destroyed)
    Communicator small = comm.shrink({2});
    T_CHECK(small.size() == 3);
    T_CHECK(small.rank() == (comm.rank() < 2 ? comm.rank() : comm.rank() - 1));
    // Old 0-1 is new 0-1: still fenced, and the plan routes around it.
    T_CHECK(small.fenced_links().size() == 1);
    T_CHECK(small.fenced_links()[0].a == 0 && small.fenced_links()[0].b == 1);
    for (int it = 0; it < 4; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, small.rank(), 3, buf.data(), buf.size());
      small.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 3, buf.data(), buf.size());
      std::vector<float> all(3 * 100);
      test::fill_pattern(DataType::Float32, small.rank(), buf.data(), 100, static_cast<std::size_t>(small.rank()) * 100);
      small.allgather(buf.data(), all.data(), 100, DataType::Float32);
      for (int b = 0; b < 3; ++b)
        wrong += test::count_wrong_pattern(DataType::Float32, b, all.data() + b * 100, 100, static_cast<std::size_t>(b) * 100);
    }
    // A second shrink of the shrunk communicator (new namespace in the same store): without
    // rank 1 the fenced link 0-1 is gone with it. (Without rank 2 instead, ranks 0 and 1 would
    // be left with only their fenced link: shrink refuses that with LinkFencedError.)
    if (small.rank() == 1) return;
    Communicator smaller = small.shrink({1});
    T_CHECK(smaller.size() == 2 && smaller.fenced_links().empty());
    int v = smaller.rank() + 1;
    smaller.allreduce(&v, &v, 1, DataType::Int32, ReduceOp::Sum);
    T_CHECK(v == 3);
    ++ok;
  });
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(wrong == 0);
  REQUIRE(ok == 2);
}

TEST_CASE("split: colors form new communicators ranked by key, a negative color gets none", "[engine][split]") {
  // 5 ranks: evens (0, 2, 4) with keys reversing their order, odds (1, 3), rank 4 opts out on a
  // second split.
  std::atomic<int> ok{0};
  const std::string err = test::run_ranks(5, small_chunks(), [&](Communicator& comm) {
    const int r = comm.rank();
    std::optional<Communicator> part = comm.split(r % 2, -r);
    T_CHECK(part.has_value());
    const int members = r % 2 == 0 ? 3 : 2;
    T_CHECK(part->size() == members);
    T_CHECK(part->rank() == (r % 2 == 0 ? (4 - r) / 2 : (3 - r) / 2));  // key -r: highest old rank first
    int v = r;
    part->allreduce(&v, &v, 1, DataType::Int32, ReduceOp::Sum);
    T_CHECK(v == (r % 2 == 0 ? 0 + 2 + 4 : 1 + 3));
    std::vector<int> order(static_cast<std::size_t>(members));
    part->allgather(&r, order.data(), 1, DataType::Int32);
    for (int i = 0; i < members; ++i) T_CHECK(order[static_cast<std::size_t>(i)] == (r % 2 == 0 ? 4 - 2 * i : 3 - 2 * i));
    std::optional<Communicator> rest = comm.split(r == 4 ? -1 : 0, r);  // a second split: a new namespace
    T_CHECK(rest.has_value() == (r != 4));
    if (rest) {
      int w = 1;
      rest->allreduce(&w, &w, 1, DataType::Int32, ReduceOp::Sum);
      T_CHECK(w == 4 && rest->rank() == r);
    }
    ++ok;
  });
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(ok == 5);
}

TEST_CASE("shrink: bad exclude lists are refused naming the rank", "[engine][shrink][validation]") {
  const std::string err = test::run_ranks(2, small_chunks(), [&](Communicator& comm) {
    for (const std::vector<int>& bad : {std::vector<int>{comm.rank()}, std::vector<int>{2}, std::vector<int>{-1}}) {
      try {
        (void)comm.shrink(bad);
        throw std::runtime_error("shrink accepted a bad list");
      } catch (const InvalidUsage& e) {
        T_CHECK(std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": shrink") != std::string::npos);
      }
    }
  });
  REQUIRE(err.empty());
}

TEST_CASE("point-to-point straight into receive buffers: alloc()ed and user buffers, several transfers per peer",
          "[engine][collectives][p2p][direct]") {
  const bool alloc = GENERATE(false, true);
  CommOptions o = small_chunks();
  o.direct_write_min_bytes = 1000;       // transfers from 1000 bytes go direct, smaller ones staged
  o.p2p_direct_user_min_bytes = 1;       // user buffers too (cross-memory attach)
  for (int n : {2, 3, 4}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
      // Per direction three transfers to the same peer: direct, staged, direct (keys are
      // published and consumed in order while staged chunks interleave).
      const std::size_t counts[] = {4099, 7, 1500};
      auto buffer = [&](std::size_t count) -> float* {
        return alloc ? static_cast<float*>(comm.alloc(count * sizeof(float))) : new float[count];
      };
      auto release = [&](float* p) {
        if (alloc) comm.free(p);
        else delete[] p;
      };
      for (int round = 0; round < 3; ++round) {
        std::vector<float*> out, in;
        comm.group_start();
        for (std::size_t k = 0; k < 3; ++k) {
          out.push_back(buffer(counts[k]));
          in.push_back(buffer(counts[k]));
          test::fill_pattern(DataType::Float32, comm.rank(), out.back(), counts[k], k * 10000 + static_cast<std::size_t>(round));
          std::fill(in.back(), in.back() + counts[k], -1.0f);
          comm.send(out.back(), counts[k], DataType::Float32, right);
          comm.recv(in.back(), counts[k], DataType::Float32, left);
        }
        comm.group_end();
        for (std::size_t k = 0; k < 3; ++k) {
          wrong += test::count_wrong_pattern(DataType::Float32, left, in[k], counts[k], k * 10000 + static_cast<std::size_t>(round));
          release(out[k]);
          release(in[k]);
        }
      }
      // alltoall with blocks above the threshold.
      const std::size_t count = 700;  // 2800 bytes per block
      float* a = buffer(count * static_cast<std::size_t>(n));
      float* b = buffer(count * static_cast<std::size_t>(n));
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      for (std::size_t j = 0; j < un; ++j) test::fill_pattern(DataType::Float32, comm.rank(), a + j * count, count, (j * un + r) * count);
      comm.alltoall(a, b, count, DataType::Float32);
      for (std::size_t s = 0; s < un; ++s)
        wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(s), b + s * count, count, (r * un + s) * count);
      release(a);
      release(b);
    });
    INFO("ranks " << n << " alloc " << alloc);
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("allgather and broadcast write final values straight into peers' outputs", "[engine][collectives][direct]") {
  const bool alloc = GENERATE(false, true);
  CommOptions o = small_chunks();
  o.direct_write_min_bytes = 1;
  o.direct_write_user_min_bytes = 1;  // user buffers by cross-memory attach
  for (int n : {2, 3, 5}) {
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      auto buffer = [&](std::size_t count) -> float* {
        return alloc ? static_cast<float*>(comm.alloc(count * sizeof(float))) : new float[count];
      };
      auto release = [&](float* p) {
        if (alloc) comm.free(p);
        else delete[] p;
      };
      for (std::size_t count : {std::size_t{1}, std::size_t{333}, std::size_t{5000}}) {
        float* in = buffer(count);
        float* out = buffer(un * count);
        test::fill_pattern(DataType::Float32, comm.rank(), in, count, r * count);
        comm.allgather(in, out, count, DataType::Float32);
        for (std::size_t b = 0; b < un; ++b)
          wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(b), out + b * count, count, b * count);
        comm.allgather(out + r * count, out, count, DataType::Float32);  // in place
        for (std::size_t b = 0; b < un; ++b)
          wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(b), out + b * count, count, b * count);
        for (int root = 0; root < n; ++root) {
          test::fill_pattern(DataType::Float32, comm.rank(), in, count);
          comm.broadcast(in, out, count, DataType::Float32, root);
          wrong += test::count_wrong_pattern(DataType::Float32, root, out, count);
        }
        release(in);
        release(out);
      }
    });
    INFO("ranks " << n << " alloc " << alloc);
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("channels: ring collectives split across lanes are exact in every placement, with checksums and direct writes",
          "[engine][collectives][channels]") {
  // 3 channels, slices from 256 bytes: 1031 floats go in 3 slices of unequal length; 5 floats stay
  // on one lane. Every lane has its own links, so each runs its own pipeline and protocol.
  const bool checksum = GENERATE(false, true);
  const bool alloc = GENERATE(false, true);
  CommOptions o = small_chunks(checksum);
  o.channels = 3;
  o.channel_min_bytes = 256;
  o.direct_write_min_bytes = 1;  // lanes also write final values into each other's outputs
  for (int n : {2, 3, 4}) {
    std::atomic<std::size_t> wrong{0};
    std::atomic<int> links_not_on_3_lanes{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
      auto buffer = [&](std::size_t bytes) -> std::byte* {
        return alloc ? static_cast<std::byte*>(comm.alloc(bytes + 1)) : new std::byte[bytes + 1];
      };
      auto release = [&](std::byte* p) {
        if (alloc) comm.free(p);
        else delete[] p;
      };
      for (std::size_t count : {std::size_t{5}, std::size_t{1031}, std::size_t{20000}})
        for (auto [type, op] : {std::pair{DataType::Float32, ReduceOp::Sum}, std::pair{DataType::Int8, ReduceOp::Max},
                                std::pair{DataType::Float16, ReduceOp::Sum}, std::pair{DataType::Float64, ReduceOp::Min}}) {
          const std::size_t elem = size_of(type), bytes = count * elem;
          std::byte* in = buffer(un * bytes);
          std::byte* out = buffer(un * bytes);
          out[un * bytes] = kGuard;
          // allreduce, out of place and in place
          test::fill_input(type, op, comm.rank(), n, in, count);
          comm.allreduce(in, out, count, type, op);
          wrong += test::count_wrong(type, op, n, out, count);
          comm.allreduce(in, in, count, type, op);
          wrong += test::count_wrong(type, op, n, in, count);
          // reduce_scatter: slices of every block
          test::fill_input(type, op, comm.rank(), n, in, un * count);
          comm.reduce_scatter(in, out, count, type, op);
          wrong += test::count_wrong(type, op, n, out, count, r * count);
          comm.reduce_scatter(in, in + r * bytes, count, type, op);
          wrong += test::count_wrong(type, op, n, in + r * bytes, count, r * count);
          // allgather
          test::fill_pattern(type, comm.rank(), in, count, r * count);
          comm.allgather(in, out, count, type);
          for (std::size_t b = 0; b < un; ++b)
            wrong += test::count_wrong_pattern(type, static_cast<int>(b), out + b * bytes, count, b * count);
          comm.allgather(out + r * bytes, out, count, type);
          for (std::size_t b = 0; b < un; ++b)
            wrong += test::count_wrong_pattern(type, static_cast<int>(b), out + b * bytes, count, b * count);
          // broadcast and reduce from every root
          for (int root = 0; root < n; ++root) {
            test::fill_pattern(type, comm.rank(), in, count);
            comm.broadcast(in, out, count, type, root);
            wrong += test::count_wrong_pattern(type, root, out, count);
            test::fill_input(type, op, comm.rank(), n, in, count);
            comm.reduce(in, out, count, type, op, root);
            if (comm.rank() == root) wrong += test::count_wrong(type, op, n, out, count);
          }
          wrong += out[un * bytes] == kGuard ? 0 : 1;
          release(in);
          release(out);
        }
      // The large calls were split: the link to the ring's right neighbour (where every ring
      // collective sends its data) carried data on all three lanes.
      const int right = (comm.rank() + 1) % n;
      for (const auto& l : comm.links())
        if (l.peer == right) links_not_on_3_lanes += l.channels_used != 3;
    });
    INFO("ranks " << n << " checksum " << checksum << " alloc " << alloc);
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
    REQUIRE(links_not_on_3_lanes == 0);
  }
}

TEST_CASE("channels: auto gives network-only communicators at least two lanes unless the host is oversubscribed",
          "[engine][channels][tcp]") {
  // Auto lanes = online cores / ranks on the host, at most 4; with every link tcp at least 2
  // when there are no more ranks than cores. One rank per core (2..8 ranks) makes the two rules
  // differ on any machine of up to 15 cores: tcp gets 2 lanes, shm 1. A 4 MiB allreduce splits
  // over min(lanes, 4) lanes; the link to the right neighbour carries the ring's data.
  const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const int n = static_cast<int>(std::clamp(cpus, 2L, 8L));
  for (const char* transports : {"tcp", "shm"}) {
    const bool network = std::string(transports) == "tcp";
    const int expected = std::clamp(std::max(static_cast<int>(cpus) / n, network && n <= cpus ? 2 : 1), 1, 4);
    CommOptions o;
    o.transports = {transports};
    o.host_id = "lanes";
    std::atomic<int> wrong_lanes{0};
    std::atomic<std::size_t> wrong{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      std::vector<float> buf(1 << 20);
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size());
      const int right = (comm.rank() + 1) % n;
      for (const auto& l : comm.links())
        if (l.peer == right) wrong_lanes += l.channels_used != expected;
    });
    INFO(transports << ", " << n << " ranks on " << cpus << " cores, expected " << expected << " lanes: " << err);
    REQUIRE(err.empty());
    REQUIRE(wrong == 0);
    REQUIRE(wrong_lanes == 0);
  }
}

TEST_CASE("channels: a corrupting link is fenced on every lane and relayed, results stay exact", "[engine][channels][health]") {
  CommOptions o = small_chunks(true);
  o.channels = 2;
  o.channel_min_bytes = 256;
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.fault = "flip:rate=1e-4,link=0-1,seed=3";
  const int n = 4;
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::size_t> relays(n);
  std::vector<LinkState> state01(n, LinkState::Up);
  const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> buf(20000);
    for (int it = 0; it < 12; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    fences[r] = comm.fenced_links();
    relays[r] = comm.relays().size();
    for (const auto& l : comm.links())
      if (LinkId::of(comm.rank(), l.peer) == LinkId{0, 1}) state01[r] = l.state;
  });
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{0, 1}});
    REQUIRE(relays[r] == 1);
    if (r <= 1) REQUIRE(state01[r] == LinkState::Fenced);
  }
}

TEST_CASE("ranks on two hosts: shm within a host, tcp across, a host-contiguous ring, every collective exact",
          "[engine][collectives][tcp][hosts]") {
  // Thread ranks that claim two hosts, placed round-robin (0 and 2 on host a, 1 and 3 on host b):
  // the home ring is 0-2-1-3, so reduce-scatter and allgather must map ring positions to
  // ranks' blocks. Links across "hosts" use tcp over this machine's interface.
  const bool checksum = GENERATE(false, true);
  const int n = 4;
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<int>> rings(n);
  std::vector<std::vector<std::string>> transport(n, std::vector<std::string>(n));
  const std::string err = test::run_ranks(
      n,
      [&](int r) {
        CommOptions o = small_chunks(checksum);
        o.chunk_bytes = 4096;
        o.host_id = r % 2 == 0 ? "host-a" : "host-b";
        return o;
      },
      [&](Communicator& comm) {
        const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(comm.rank());
        for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{70000}}) {
          std::vector<float> in(un * count), out(un * count);
          test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), count);
          comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
          wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count);
          test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), un * count);
          comm.reduce_scatter(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
          wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count, r * count);
          test::fill_pattern(DataType::Float32, comm.rank(), in.data(), count, r * count);
          comm.allgather(in.data(), out.data(), count, DataType::Float32);
          for (std::size_t b = 0; b < un; ++b)
            wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(b), out.data() + b * count, count, b * count);
          for (int root = 0; root < n; ++root) {
            test::fill_pattern(DataType::Float32, comm.rank(), in.data(), count);
            comm.broadcast(in.data(), out.data(), count, DataType::Float32, root);
            wrong += test::count_wrong_pattern(DataType::Float32, root, out.data(), count);
            test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), count);
            comm.reduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum, root);
            if (comm.rank() == root) wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count);
          }
          for (std::size_t j = 0; j < un; ++j)
            for (std::size_t i = 0; i < count; ++i) in[j * count + i] = static_cast<float>(r * 1000 + j + i % 7);
          comm.alltoall(in.data(), out.data(), count, DataType::Float32);
          for (std::size_t j = 0; j < un; ++j)
            for (std::size_t i = 0; i < count; ++i) wrong += out[j * count + i] != static_cast<float>(j * 1000 + r + i % 7);
        }
        rings[r] = comm.ring();
        for (const auto& l : comm.links()) transport[r][static_cast<std::size_t>(l.peer)] = l.transport;
      });
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(rings[r] == std::vector<int>{0, 2, 1, 3});
    for (int p = 0; p < n; ++p)
      if (p != r) REQUIRE(transport[r][p] == (p % 2 == r % 2 ? "shm" : "tcp"));
  }
}
