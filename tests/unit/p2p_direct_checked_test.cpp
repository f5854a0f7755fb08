// Point-to-point transfers written straight into the receiver's buffer with checksums on
// (RingRunner::run_p2p, fetch_p2p_key, service_nacks): the receiver verifies each chunk where it
// landed and asks for damaged ones again; a receive-buffer key that reaches the sender damaged
// or not at all is asked for again (kRepublishKeyPiece); the sender returns only once its
// direct chunks are accepted, so it may overwrite its buffer at once.
#include <atomic>
#include <limits>
#include <ringfence/communicator.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {
// Direct transfers from 1000 bytes into plain user buffers, 4 KiB chunks: a message fits the
// slots (4 x 4 KiB) up to 16 KiB.
CommOptions direct_options(bool checksum, const std::string& transport) {
  CommOptions o;
  o.checksum = checksum;
  o.transports = {transport};
  o.chunk_bytes = 4096;
  o.transport_settings["RINGFENCE_TCP_CHUNK_BYTES"] = "4096";  // tcp's own default is larger
  o.direct_write_min_bytes = 1000;
  o.p2p_direct_user_min_bytes = 1;
  o.timeout = std::chrono::seconds(5);  // a deadlock shows as a timeout, not a hang
  o.host_id = "p2p-direct";
  return o;
}
}  // namespace

TEST_CASE("direct point-to-point with checksums: damaged and lost chunks and keys are asked for again, every transfer exact",
          "[integrity][fault][p2p][direct]") {
  // More than the four 4 KiB slots hold (a blocking send that fits them is staged): five chunks,
  // the last of 4 bytes, or twelve; the sender waits for credits while the receiver repairs.
  const std::size_t count = GENERATE(std::size_t{4097}, std::size_t{12000});
  // shm writes user buffers by cross-memory attach; tcp's receiver thread writes them.
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  INFO(count << " floats over " << transport);
  CommOptions o = direct_options(true, transport);  // every transfer here goes direct
  o.health_enabled = false;  // the link must stay in use: no fence, no relay
  o.timeout = std::chrono::seconds(30);
  // About one key in twenty (header and key, some 50 bytes) arrives damaged, one write in
  // twenty not at all; most 4 KiB chunks are damaged, many whole deliveries in a row.
  o.fault = "flip:rate=1e-3,link=0-1,seed=5;drop:rate=0.05,link=0-1,seed=6";
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> damaged_keys{0}, damaged_chunks{0};
  const int transfers = 150;
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<float> buf(count);
    for (int it = 0; it < transfers; ++it) {
      const std::size_t first = static_cast<std::size_t>(it) * 7;  // every transfer differs
      if (comm.rank() == 0) {
        test::fill_pattern(DataType::Float32, 0, buf.data(), count, first);
        comm.send(buf.data(), count, DataType::Float32, 1);
        // Returned: a re-send of a direct chunk would read this buffer, so none may be pending.
        std::fill(buf.begin(), buf.end(), std::numeric_limits<float>::quiet_NaN());
      } else {
        std::fill(buf.begin(), buf.end(), -1.0f);
        comm.recv(buf.data(), count, DataType::Float32, 0);
        wrong += test::count_wrong_pattern(DataType::Float32, 0, buf.data(), count, first);
      }
    }
    // Rank 0 receives no chunks, so its checksum errors are keys that arrived damaged.
    for (const auto& l : comm.links()) (comm.rank() == 0 ? damaged_keys : damaged_chunks) += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  INFO(damaged_keys << " damaged keys, " << damaged_chunks << " damaged chunks");
  CHECK(damaged_keys > 0);
  CHECK(damaged_chunks > 0);
}


TEST_CASE("a send that fits the slots returns once written, direct transfers or not: every rank may send before it receives",
          "[p2p][direct]") {
  const bool checksum = GENERATE(true, false);
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const int n = GENERATE(2, 3);
  INFO(n << " ranks over " << transport << ", checksums " << checksum);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(n, direct_options(checksum, transport), [&](Communicator& comm) {
    const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
    const std::size_t count = 3000;  // 12000 bytes: above the direct threshold, within the slots
    std::vector<float> out(count), in(count);
    for (int it = 0; it < 20; ++it) {
      test::fill_pattern(DataType::Float32, comm.rank(), out.data(), count, static_cast<std::size_t>(it));
      comm.send(out.data(), count, DataType::Float32, right);  // outside a group: must not wait for `right`'s recv
      comm.recv(in.data(), count, DataType::Float32, left);
      wrong += test::count_wrong_pattern(DataType::Float32, left, in.data(), count, static_cast<std::size_t>(it));
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}

TEST_CASE("a sender waits for its direct chunks to be accepted, not for staged ones queued behind them", "[p2p][direct]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  INFO(transport);
  std::atomic<std::size_t> wrong{0};
  const std::size_t big = 20000, small = 100;  // 80 KB: more than the slots hold, so direct; 400 B: staged
  const std::string error = test::run_ranks(2, direct_options(true, transport), [&](Communicator& comm) {
    std::vector<float> x(big), b(small), d(big);
    if (comm.rank() == 0) {
      test::fill_pattern(DataType::Float32, 0, x.data(), big, 1);
      test::fill_pattern(DataType::Float32, 0, b.data(), small, 2);
      comm.group_start();
      comm.send(x.data(), big, DataType::Float32, 1);    // direct
      comm.send(b.data(), small, DataType::Float32, 1);  // staged: rank 1 takes it last
      comm.group_end();
      // Rank 1 sends `d` before it receives `b`: had the group waited for `b`'s acceptance, both
      // ranks would wait on each other.
      comm.recv(d.data(), big, DataType::Float32, 1);
      wrong += test::count_wrong_pattern(DataType::Float32, 1, d.data(), big, 3);
    } else {
      comm.recv(x.data(), big, DataType::Float32, 0);
      test::fill_pattern(DataType::Float32, 1, d.data(), big, 3);
      comm.send(d.data(), big, DataType::Float32, 0);  // direct: waits for rank 0's receive
      comm.recv(b.data(), small, DataType::Float32, 0);
      wrong += test::count_wrong_pattern(DataType::Float32, 0, x.data(), big, 1);
      wrong += test::count_wrong_pattern(DataType::Float32, 0, b.data(), small, 2);
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}

TEST_CASE("a group receiving into more buffers than the registration cache holds: every transfer exact, twice",
          "[p2p][direct]") {
  // 40 receives into 40 buffers in one group, each larger than the slots hold, so each goes
  // direct and registers its buffer: more than the cache's 32 entries, so registrations of
  // receives already done are dropped (tcp then hands their ids to later buffers, whose keys
  // match the peer's cached imports byte for byte). One key per peer is in use at a time, so
  // none in use is dropped (reg_cache_test.cpp covers calls that hold more at once).
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const bool checksum = GENERATE(true, false);
  INFO(transport << (checksum ? ", checksums" : ", no checksums"));
  CommOptions o = direct_options(checksum, transport);
  const std::size_t count = 4097, messages = 40;
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<std::vector<float>> bufs(messages, std::vector<float>(count));
    for (int round = 0; round < 2; ++round) {  // the second finds some entries cached, some not
      comm.group_start();
      for (std::size_t i = 0; i < messages; ++i) {
        const std::size_t first = i * 11 + static_cast<std::size_t>(round);
        if (comm.rank() == 0) {
          test::fill_pattern(DataType::Float32, 0, bufs[i].data(), count, first);
          comm.send(bufs[i].data(), count, DataType::Float32, 1);
        } else {
          std::fill(bufs[i].begin(), bufs[i].end(), -1.0f);
          comm.recv(bufs[i].data(), count, DataType::Float32, 0);
        }
      }
      comm.group_end();
      if (comm.rank() == 1)
        for (std::size_t i = 0; i < messages; ++i)
          wrong += test::count_wrong_pattern(DataType::Float32, 0, bufs[i].data(), count, i * 11 + static_cast<std::size_t>(round));
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}

TEST_CASE("a direct send whose receive never comes times out naming the receiver's key, not a staging slot",
          "[p2p][direct][failure]") {
  const bool checksum = GENERATE(true, false);
  INFO((checksum ? "checksums" : "no checksums"));
  CommOptions o = direct_options(checksum, "shm");  // setup keeps the helper's 5 s
  o.heartbeat_interval = std::chrono::milliseconds(0);  // rank 1 idles: nothing else may end the send first
  std::atomic<bool> done{false};
  std::string what;
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    if (comm.rank() == 1) {  // never receives; stays until rank 0 gave up (or 60 s passed)
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!done && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    struct Done {  // however rank 0 leaves, rank 1 stops waiting
      std::atomic<bool>& flag;
      ~Done() { flag = true; }
    } mark{done};
    comm.set_timeout(std::chrono::milliseconds(500));
    std::vector<float> buf(12000, 1.0f);  // more than the slots hold: direct
    try {
      comm.send(buf.data(), buf.size(), DataType::Float32, 1);
      what = "no error";
    } catch (const TimeoutError& e) {
      what = e.what();
    }
  });
  INFO(error << " | " << what);
  REQUIRE(error.empty());
  CHECK(what.find("buffer key for a direct send") != std::string::npos);
  CHECK(what.find("rank 1") != std::string::npos);
}
