// Chunks a call leaves unaccepted when it returns (checksum mode, RingRunner::retain_unaccepted):
// a receiver may find one corrupted after the sender's call returned, and the re-send must
// carry the bytes the call was given, whatever the caller did with its buffer since. The calls
// here overwrite their input and output the moment a call returns. Point-to-point transfers
// first wait a little for their receivers' acceptance (RingRunner::await_p2p_acceptance), which
// must neither lose a re-send nor wait for a receive that comes only after the send returned.
#include <atomic>
#include <limits>
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// Re-sends of a call's last chunks happen during a later call: one more collective, then the
// chunks this rank re-sent over all its links.
std::uint64_t resends_after_settling(Communicator& comm) {
  float one = 1.0f;
  comm.allreduce(&one, &one, 1, DataType::Float32, ReduceOp::Sum);
  std::uint64_t resends = 0;
  for (const auto& l : comm.links()) resends += l.retries;
  return resends;
}

// 300 float sums of `count` elements over a link that flips bits, each rank overwriting its
// input and output as soon as a call returns: no element may come out wrong, and some chunks
// must have been re-sent.
void overwrite_on_return(int n, std::size_t count, std::size_t chunk_bytes) {
  INFO(n << " ranks, " << count << " floats, " << chunk_bytes << "-byte chunks");
  CommOptions o;
  o.chunk_bytes = chunk_bytes;
  o.checksum = true;
  o.health_enabled = false;  // the link must stay in use: no fence, no relay
  o.timeout = std::chrono::seconds(30);
  o.fault = "flip:rate=1e-3,link=0-1,seed=21";
  o.host_id = "retained-chunks";
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> resends{0};
  const int calls = 300;
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    std::vector<float> in(count), out(count);
    for (int it = 0; it < calls; ++it) {
      const std::size_t first = static_cast<std::size_t>(it) * 3;  // every call's input differs
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), count, first);
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      std::fill(in.begin(), in.end(), std::numeric_limits<float>::quiet_NaN());  // reused at once
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count, first);
      // A ring's last chunks are sent from the output: overwritten too.
      std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
    }
    resends += resends_after_settling(comm);
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  CHECK(resends > 0);  // the link really damaged chunks, so some re-sends ran
}

}  // namespace

TEST_CASE("retained chunks: a caller that overwrites its buffers as soon as a call returns still gets exact results over a corrupting link",
          "[integrity][fault][retain]") {
  const int n = GENERATE(2, 3);  // one-shot at 2 ranks (every rank sends its input); a ring at 3
  const std::size_t count = GENERATE(std::size_t{2}, std::size_t{12}, std::size_t{256}, std::size_t{2048});  // 8 B-8 KiB
  // One chunk per call, or (256-byte chunks, 4 slots) up to 32: then a call returns with its
  // last `slots` chunks possibly unaccepted, and a damaged one may be any of them, not only
  // the last (each is copied aside right after its signal: RingRunner::retains_at_send).
  const std::size_t chunk_bytes = GENERATE(std::size_t{256} << 10, std::size_t{256});
  overwrite_on_return(n, count, chunk_bytes);
}

TEST_CASE("retained chunks: a call that waits for its last chunk's acceptance instead of copying it keeps results exact too",
          "[integrity][fault][retain]") {
  // 64 KiB: a 2-rank ring ends with its 32 KiB last chunk unaccepted, and with a CPU per rank
  // waits for it rather than copy it aside (EngineConfig::retain_max_bytes). On a machine with
  // one CPU the two ranks share it and copy instead, as the test above does.
  overwrite_on_return(2, 16384, std::size_t{256} << 10);
}

namespace {
// 64 KiB chunks, 4 slots: a point-to-point transfer of up to 256 KiB fits the slots and returns
// once written, with up to four chunks its receiver has not accepted yet, more than
// retain_max_bytes (16 KiB with a CPU per rank, 64 KiB on fewer CPUs), so the sender first waits
// a little for their acceptance (RingRunner::await_p2p_acceptance), then copies what is left.
CommOptions p2p_retaining(const char* fault, const std::string& transport) {
  CommOptions o;
  o.chunk_bytes = std::size_t{64} << 10;
  o.slots = 4;
  o.transports = {transport};
  o.transport_settings["RINGFENCE_TCP_CHUNK_BYTES"] = "65536";
  o.checksum = true;
  o.health_enabled = false;  // the damaging link must stay in use: no fence, no relay
  o.timeout = std::chrono::seconds(10);  // a deadlock shows as a timeout, not a hang
  o.fault = fault;
  o.host_id = "retained-p2p";
  return o;
}
}  // namespace

TEST_CASE("retained chunks: a point-to-point exchange over a corrupting link, buffers overwritten on return, stays exact",
          "[integrity][fault][retain][p2p]") {
  // Every rank sends to and receives from both neighbours in one group, 200 KB each way: the
  // receivers take our chunks in the same call, so the sender's wait for their acceptance
  // usually ends it, and it serves their re-send requests meanwhile.
  const int n = GENERATE(2, 3);
  INFO(n << " ranks");
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> resends{0};
  const std::string error = test::run_ranks(n, p2p_retaining("flip:rate=5e-6,link=0-1,seed=17", "shm"), [&](Communicator& comm) {
    const int r = comm.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
    const std::size_t count = 50000;
    std::vector<float> to_right(count), to_left(count), from_left(count), from_right(count);
    for (int it = 0; it < 30; ++it) {
      const auto first = static_cast<std::size_t>(it) * 7;
      test::fill_pattern(DataType::Float32, r, to_right.data(), count, first);
      test::fill_pattern(DataType::Float32, r, to_left.data(), count, first + count);
      comm.group_start();
      comm.send(to_right.data(), count, DataType::Float32, right);
      if (left != right) comm.send(to_left.data(), count, DataType::Float32, left);
      comm.recv(from_left.data(), count, DataType::Float32, left);
      if (left != right) comm.recv(from_right.data(), count, DataType::Float32, right);
      comm.group_end();
      // Overwritten at once: a re-send after this point must come from the copy aside.
      std::fill(to_right.begin(), to_right.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(to_left.begin(), to_left.end(), std::numeric_limits<float>::quiet_NaN());
      wrong += test::count_wrong_pattern(DataType::Float32, left, from_left.data(), count, first);
      if (left != right) wrong += test::count_wrong_pattern(DataType::Float32, right, from_right.data(), count, first + count);
    }
    resends += resends_after_settling(comm);
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  CHECK(resends > 0);  // the link really damaged chunks
}

TEST_CASE("retained chunks: sends that fit the slots still return before their receives are posted when the sender waits for acceptance",
          "[retain][p2p]") {
  // Every rank sends 200 KB to its right, outside a group, before it receives from its left: no
  // receiver can accept before the sender's call returns, so the wait for acceptance must give
  // up by itself (bounded by the copy's time), not wait for the receiver.
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const int n = GENERATE(2, 3);
  INFO(n << " ranks over " << transport);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(n, p2p_retaining("", transport), [&](Communicator& comm) {
    const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
    const std::size_t count = 50000;
    std::vector<float> out(count), in(count);
    for (int it = 0; it < 10; ++it) {
      test::fill_pattern(DataType::Float32, comm.rank(), out.data(), count, static_cast<std::size_t>(it));
      comm.send(out.data(), count, DataType::Float32, right);
      std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
      comm.recv(in.data(), count, DataType::Float32, left);
      wrong += test::count_wrong_pattern(DataType::Float32, left, in.data(), count, static_cast<std::size_t>(it));
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}
