// End-to-end integrity: CRC32C, the fault-injection grammar, and corrupted links that never
// corrupt a result when checksums are on.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <tuple>
#include <ringfence/communicator.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/events.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "checked_ops.hpp"
#include "support/fence_scenario.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

TEST_CASE("crc32c matches the standard check values, in hardware and in the table", "[integrity][crc32c]") {
  REQUIRE(crc32c("123456789", 9) == 0xE3069283u);
  REQUIRE(crc32c_portable("123456789", 9) == 0xE3069283u);
  REQUIRE(crc32c("", 0) == 0u);
  std::vector<unsigned char> zeros(32, 0);
  REQUIRE(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  std::mt19937 rng(3);
  std::vector<unsigned char> buf(100003);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  INFO("implementation: " << crc32c_implementation());
  // Short inputs, the folding path (256 bytes per round, 16-byte and ragged tails), the
  // three-stream path (3072 bytes per round), at odd offsets too.
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 63u, 255u, 256u, 257u, 271u, 272u, 511u, 512u, 513u, 4099u, 3071u, 3072u,
                          3073u, 6144u, 12288u, 20000u, 100000u}) {
    for (std::size_t at : {0u, 1u, 3u}) {
      const unsigned char* p = buf.data() + at;
      const std::uint32_t want = crc32c_portable(p, len);
      CAPTURE(len, at);
      REQUIRE(crc32c(p, len) == want);
      REQUIRE(crc32c_with(Crc32cImpl::Sse42, p, len) == want);
      REQUIRE(crc32c_with(Crc32cImpl::Fold, p, len) == want);
      REQUIRE(crc32c_with(Crc32cImpl::Table, p, len, 0x12345678u) == crc32c_portable(p, len, 0x12345678u));
      REQUIRE(crc32c_with(Crc32cImpl::Fold, p, len, 0x12345678u) == crc32c_portable(p, len, 0x12345678u));
    }
    REQUIRE(crc32c(buf.data(), len) == crc32c_portable(buf.data(), len));
    // Incremental == one shot.
    const std::size_t half = len / 2;
    REQUIRE(crc32c(buf.data() + half, len - half, crc32c(buf.data(), half)) == crc32c(buf.data(), len));
  }
  // Any single bit flip changes the CRC.
  const std::uint32_t good = crc32c(buf.data(), buf.size());
  for (std::size_t bit = 0; bit < 64; ++bit) {
    buf[bit * 13 % buf.size()] ^= static_cast<unsigned char>(1u << (bit % 8));
    REQUIRE(crc32c(buf.data(), buf.size()) != good);
    buf[bit * 13 % buf.size()] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

TEST_CASE("checked copies and reductions give the pass's result and the CRCs of input and result", "[integrity][crc32c]") {
  INFO("implementation: " << crc32c_implementation());
  std::mt19937 rng(11);
  std::vector<std::byte> a(70000), b(70000), dst(70000), want(70000);
  for (auto& x : a) x = static_cast<std::byte>(rng());
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0x3f);  // small values: no overflow worries for exactness
  // Lengths around the 256-byte fold steps, the 2 KiB groups and the 8 KiB blocks.
  for (std::size_t len : {0u, 1u, 16u, 255u, 256u, 257u, 2047u, 2048u, 2049u, 8191u, 8192u, 8200u, 65536u, 69999u}) {
    CAPTURE(len);
    std::fill(dst.begin(), dst.end(), std::byte{0});
    REQUIRE(copy_bytes_crc(dst.data(), a.data() + 1, len) == crc32c_portable(a.data() + 1, len));
    REQUIRE(std::memcmp(dst.data(), a.data() + 1, len) == 0);
    for (const auto& [type, elem] : {std::pair{DataType::Uint8, std::size_t{1}}, std::pair{DataType::Float16, std::size_t{2}},
                                     std::pair{DataType::Int32, std::size_t{4}}, std::pair{DataType::Float64, std::size_t{8}}}) {
      const std::size_t count = len / elem, bytes = count * elem;
      const Reducer r = host_reducer(type, ReduceOp::Sum);
      r.combine(want.data(), a.data(), b.data(), count, 2);
      std::uint32_t crc_a = 0, crc_dst = 0;
      detail::combine_with_crc(r.combine, dst.data(), a.data(), b.data(), count, elem, 2, &crc_a, &crc_dst);
      REQUIRE(std::memcmp(dst.data(), want.data(), bytes) == 0);
      REQUIRE(crc_a == crc32c_portable(a.data(), bytes));
      REQUIRE(crc_dst == crc32c_portable(want.data(), bytes));
      // In place (dst is a): the CRC of a is taken before the block is overwritten.
      std::vector<std::byte> inplace(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(bytes));
      detail::combine_with_crc(r.combine, inplace.data(), inplace.data(), b.data(), count, elem, 2, &crc_a, &crc_dst);
      REQUIRE(crc_a == crc32c_portable(a.data(), bytes));
      REQUIRE(crc_dst == crc32c_portable(want.data(), bytes));
    }
  }
}

TEST_CASE("fault spec grammar", "[integrity][fault]") {
  const auto rules =
      parse_fault_spec("flip:rate=1e-5,link=0-1,seed=7; delay:us=50,link=*;stall:after=10,ms=200,link=2-3;drop:rate=0.5");
  REQUIRE(rules.size() == 4);
  REQUIRE(rules[3].kind == FaultKind::Drop);
  REQUIRE(rules[3].rate == 0.5);
  REQUIRE(rules[0].kind == FaultKind::Flip);
  REQUIRE(rules[0].rate == 1e-5);
  REQUIRE(rules[0].seed == 7);
  REQUIRE(rules[0].matches(0, 1));
  REQUIRE(rules[0].matches(1, 0));
  REQUIRE_FALSE(rules[0].matches(1, 2));
  REQUIRE(rules[1].kind == FaultKind::Delay);
  REQUIRE(rules[1].delay == std::chrono::microseconds(50));
  REQUIRE(rules[1].matches(5, 9));
  REQUIRE(rules[2].kind == FaultKind::Stall);
  REQUIRE(rules[2].after == 10);
  REQUIRE(rules[2].stall == std::chrono::milliseconds(200));
  REQUIRE(parse_fault_spec("").empty());
  const auto throttle = parse_fault_spec("throttle:mbps=250,link=1-2");
  REQUIRE(throttle.size() == 1);
  REQUIRE(throttle[0].kind == FaultKind::Throttle);
  REQUIRE(throttle[0].mbps == 250.0);
  const auto healing = parse_fault_spec("flip:rate=1e-3,after=5,until=80");
  REQUIRE(healing.size() == 1);
  REQUIRE(healing[0].after == 5);
  REQUIRE(healing[0].until == 80);
  REQUIRE(parse_fault_spec("flip:rate=1e-3")[0].until == 0);  // no end
  REQUIRE(parse_fault_spec("drop:rate=0.1,for_ms=250")[0].for_ms == std::chrono::milliseconds(250));
  for (const char* bad : {"boom:rate=1", "flip:rate=2", "flip:rate=x", "flip:link=1", "flip:link=1-1", "flip:speed=3",
                          "flip:rate", "throttle:link=0-1", "throttle:mbps=0", "flip:until=0", "flip:after=9,until=9", "flip:for_ms=0", "flip:for_ms=-1"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_fault_spec(bad), InvalidUsage);
  }
}

namespace {

// Thread ranks (see thread_ranks_test.cpp); returns the number of wrong elements over all
// ranks, and the checksum errors / re-sends seen, for float32 sum allreduces.
struct Outcome {
  std::size_t wrong = 0;
  std::uint64_t checksum_errors = 0;
  std::uint64_t resends = 0;
  std::string error;
};

Outcome run_with_faults(int n, CommOptions options, std::size_t count, int iterations) {
  auto store = std::make_shared<InProcessStore>();
  std::vector<std::thread> threads;
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> crc{0}, resends{0};
  std::mutex mutex;
  Outcome out;
  options.host_id = "integrity";
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(store, r, n, builtin_transports(), options);
        std::vector<float> buf(count);
        for (int it = 0; it < iterations; ++it) {
          test::fill_input(DataType::Float32, ReduceOp::Sum, r, n, buf.data(), count);
          comm.allreduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum);
          wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), count);
        }
        // A call may return before its last chunks were verified (they are kept for re-sends):
        // once every rank finished one more collective, every re-send of the last one is done.
        float one = 1.0f;
        comm.allreduce(&one, &one, 1, DataType::Float32, ReduceOp::Sum);
        for (const auto& l : comm.links()) {
          crc += l.checksum_errors;
          resends += l.retries;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        if (out.error.empty()) out.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  out.wrong = wrong;
  out.checksum_errors = crc;
  out.resends = resends;
  return out;
}

}  // namespace

TEST_CASE("a corrupting link corrupts results without checksums", "[integrity][fault]") {
  CommOptions o;
  o.checksum = false;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.fault = "flip:rate=1e-4,link=0-1,seed=11";
  const Outcome r = run_with_faults(3, o, 100000, 3);
  INFO(r.error);
  REQUIRE(r.error.empty());
  REQUIRE(r.wrong > 0);  // the injector really corrupts: otherwise the next test proves nothing
  REQUIRE(r.checksum_errors == 0);
}

TEST_CASE("with checksums a corrupting link never corrupts a result", "[integrity][fault]") {
  for (const bool direct : {false, true}) {
    CommOptions o;
    o.chunk_bytes = 4096;
    o.timeout = std::chrono::seconds(20);
    o.checksum = true;
    o.fault = "flip:rate=1e-4,link=0-1,seed=11";
    if (direct) {
      o.direct_write_min_bytes = 1;
      o.direct_write_user_min_bytes = 1;
    }
    const Outcome r = run_with_faults(3, o, 100000, 3);
    INFO("direct " << direct << ": " << r.error);
    REQUIRE(r.error.empty());
    REQUIRE(r.wrong == 0);
    REQUIRE(r.checksum_errors > 0);
    // Every detected corruption was answered by a re-send: of the whole chunk, or, for a chunk
    // repaired in pieces, of each piece asked for (one whole failure starts the repair, and
    // every piece asked for is sent at least once).
    REQUIRE(r.resends >= r.checksum_errors);
  }
}

TEST_CASE("a link that loses writes: wrong results without checksums, exact with them", "[integrity][fault]") {
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 0;  // keep the lossy link in use: this tests re-sends, not fencing
  o.checksum = false;
  o.fault = "drop:rate=0.02,link=1-2,seed=4";
  const Outcome lossy = run_with_faults(3, o, 100000, 3);
  INFO(lossy.error);
  REQUIRE(lossy.error.empty());
  REQUIRE(lossy.wrong > 0);
  o.checksum = true;
  const Outcome protected_run = run_with_faults(3, o, 100000, 3);
  INFO(protected_run.error);
  REQUIRE(protected_run.error.empty());
  REQUIRE(protected_run.wrong == 0);
  REQUIRE(protected_run.checksum_errors > 0);
}

TEST_CASE("a throttled link slows the collective down and keeps results exact", "[integrity][fault]") {
  // 2 MB per rank through a 20 MB/s link: at least ~50 ms per call on that link.
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.fault = "throttle:mbps=20,link=0-1";
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome slow = run_with_faults(2, o, 500000, 2);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  INFO(slow.error);
  REQUIRE(slow.error.empty());
  REQUIRE(slow.wrong == 0);
  REQUIRE(ms >= 100);  // 2 calls x 2 MB over 20 MB/s each way: a lower bound, never an upper one
}

TEST_CASE("fault windows: until= and for_ms= end a fault", "[integrity][fault]") {
  // Without checksums a corrupting link corrupts results; a rule whose window ended does not.
  CommOptions o;
  o.checksum = false;
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 4096;
  o.fault = "flip:rate=1e-3,link=0-1,until=1";  // only the very first write of each end
  const Outcome few = run_with_faults(3, o, 30000, 6);
  o.fault = "flip:rate=1e-3,link=0-1";
  const Outcome all = run_with_faults(3, o, 30000, 6);
  o.fault = "flip:rate=1e-3,link=0-1,for_ms=1";  // over before most of the traffic
  const Outcome brief = run_with_faults(3, o, 30000, 6);
  INFO(few.error << all.error << brief.error);
  REQUIRE(all.wrong > few.wrong);
  REQUIRE(all.wrong > brief.wrong);
}

TEST_CASE("checksums on a clean link: exact, no errors, every dtype and op", "[integrity]") {
  auto store = std::make_shared<InProcessStore>();
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> errors{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Communicator comm(store, r, 2, builtin_transports(), CommOptions{.chunk_bytes = 512, .host_id = "clean", .checksum = true});
      for (int t = 0; t < kNumDataTypes; ++t)
        for (int o = 0; o < kNumReduceOps; ++o) {
          const auto type = static_cast<DataType>(t);
          const auto op = static_cast<ReduceOp>(o);
          std::vector<std::byte> buf(3001 * size_of(type));
          test::fill_input(type, op, r, 2, buf.data(), 3001);
          comm.allreduce(buf.data(), buf.data(), 3001, type, op);
          wrong += test::count_wrong(type, op, 2, buf.data(), 3001);
        }
      for (const auto& l : comm.links()) errors += l.checksum_errors + l.retries;
    });
  for (auto& t : threads) t.join();
  REQUIRE(wrong == 0);
  REQUIRE(errors == 0);
}

TEST_CASE("a link that corrupts every delivery fails with a clear error, not a wrong result", "[integrity][fault]") {
  CommOptions o;
  o.chunk_bytes = 256;
  o.timeout = std::chrono::seconds(10);
  o.checksum = true;
  o.fault = "flip:rate=1,link=0-1";
  const Outcome r = run_with_faults(2, o, 1000, 1);
  REQUIRE_THAT(r.error, Catch::Contains("checksum") && Catch::Contains("rank"));
  REQUIRE(r.wrong == 0);  // nobody returned a result
}

// The fence scenario (thread ranks, random float inputs, checksums, agreement every 4
// collectives) and its comparison with the fault-free run: tests/support/fence_scenario.hpp.

TEST_CASE("a corrupting link is fenced by agreement and relayed around: results stay bit-identical", "[integrity][health]") {
  // The point of ringfence: the protected run's float sums are byte-for-byte those of the
  // fault-free run, although a link corrupted data and was fenced mid-way (4 and 3 ranks).
  for (const auto& [n, link, relay] : {std::tuple{4, std::string("0-1"), Relay{0, 2, 1}},
                                       std::tuple{3, std::string("1-2"), Relay{1, 0, 2}}}) {
    INFO("ranks " << n << ", corrupting link " << link);
    const auto [clean, faulty] = test::run_against_clean(n, "flip:rate=1e-4,link=" + link + ",seed=3", {}, builtin_transports(), 24, 30000);
    const auto a = std::stoi(link.substr(0, 1)), b = std::stoi(link.substr(2, 1));
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      REQUIRE(clean.epochs[r] == 0);
      REQUIRE(faulty.epochs[r] == 1);
      REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId::of(a, b)});
      REQUIRE(faulty.relays[r] == std::vector<Relay>{relay});
      REQUIRE(faulty.rings[r] == clean.rings[r]);      // the logical ring did not change
      REQUIRE(faulty.errors_after_first_epoch[r] == 0);     // the bad link carries nothing any more
      REQUIRE(test::fenced_ends_show_fenced(faulty, r));
    }
  }
}

TEST_CASE("a relay hop that corrupts is caught on its own link and fenced in turn: results stay bit-identical",
          "[integrity][health][relay]") {
  // Link 0-1 corrupts and is relayed 0->2->1; then the first hop of that relay (0-2) corrupts
  // too. The relay checks every chunk it forwards, so the damage is blamed on link 0-2 (not on
  // 2-1, which is fine), re-sent by rank 0, and 0-2 is fenced in turn: relay 0->3->1.
  const int n = 4;
  const auto [clean, faulty] =
      test::run_against_clean(n, "flip:rate=1e-4,link=0-1,seed=3;flip:rate=1e-4,link=0-2,seed=5", {}, builtin_transports(), 32, 30000);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.epochs[r] == 2);  // fenced 0-1, then 0-2
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId{0, 1}, LinkId{0, 2}});
    REQUIRE(faulty.relays[r] == std::vector<Relay>{Relay{0, 3, 1}});
    REQUIRE(faulty.rings[r] == clean.rings[r]);
    REQUIRE(test::fenced_ends_show_fenced(faulty, r));
  }
}

namespace {

// What one rank saw in a run of exact int32 allreduces: its final plan, and the sequence numbers
// at which link `watched` was last fenced, readmitted and reported healthy (0 = never).
struct PlanOutcome {
  std::vector<LinkId> fences;
  std::vector<int> ring;
  std::size_t relays = 99;
  std::uint64_t epoch = 0, fenced_at = 0, readmitted_at = 0, healthy_at = 0;
};

// `iterations` int32 sum allreduces of `count` elements on `n` thread ranks; `before(it, comm)`
// runs before each (storms, sleeps). Returns the first error ("" if none); wrong elements over
// all ranks go to `wrong`.
std::string run_plan_scenario(int n, const CommOptions& o, int iterations, std::size_t count, LinkId watched,
                              const std::function<void(int, Communicator&)>& before, std::vector<PlanOutcome>& out,
                              std::size_t& wrong) {
  out.assign(static_cast<std::size_t>(n), PlanOutcome{});
  std::atomic<std::size_t> bad{0};
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    PlanOutcome& mine = out[static_cast<std::size_t>(comm.rank())];
    comm.on_health_event([&](const HealthEvent& e) {
      if (e.a != watched.a || e.b != watched.b) return;
      if (e.kind == EventKind::LinkFenced) mine.fenced_at = e.sequence;
      if (e.kind == EventKind::LinkReadmitted) mine.readmitted_at = e.sequence;
      if (e.kind == EventKind::LinkHealthy) mine.healthy_at = e.sequence;
    });
    std::vector<std::int32_t> buf(count);
    for (int it = 0; it < iterations; ++it) {
      before(it, comm);
      test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
      bad += test::count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    mine.fences = comm.fenced_links();
    mine.ring = comm.ring();
    mine.relays = comm.relays().size();
    mine.epoch = comm.epoch();
  });
  wrong = bad;
  return error;
}

}  // namespace

TEST_CASE("when no relay can carry the fenced hops the ring is re-ordered around them, with exact results",
          "[integrity][health][replan]") {
  // Five ranks; links 0-1, 1-2, 2-3 and 0-4 corrupt: four of the five hops of ring 0..4. No set
  // of relays carries all four (each rank is left two or three links), but one ring avoids them:
  // 0, 2, 4, 1, 3. Inputs whose sums are exact in any order (the reduction order changes).
  const int n = 5;
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.health_agree_every = 4;
  o.fault = "flip:rate=1e-4,link=0-1,seed=3;flip:rate=1e-4,link=1-2,seed=4;flip:rate=1e-4,link=2-3,seed=5;"
            "flip:rate=1e-4,link=0-4,seed=6";
  o.host_id = "replan";
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 32, 30000, LinkId{0, 1}, [](int, Communicator&) {}, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    std::vector<LinkId> f = out[static_cast<std::size_t>(r)].fences;
    std::sort(f.begin(), f.end(), [](LinkId x, LinkId y) { return std::pair(x.a, x.b) < std::pair(y.a, y.b); });
    REQUIRE(f == std::vector<LinkId>{LinkId{0, 1}, LinkId{0, 4}, LinkId{1, 2}, LinkId{2, 3}});
    REQUIRE(out[static_cast<std::size_t>(r)].ring == std::vector<int>{0, 2, 4, 1, 3});
    REQUIRE(out[static_cast<std::size_t>(r)].relays == 0);
  }
}

TEST_CASE("a link fenced for checksum errors whose corruption stopped is readmitted after its cool-down and probation",
          "[integrity][health][probation]") {
  // The link corrupts only its first writes (a burst), is fenced on checksum evidence alone, serves
  // its cool-down, comes back on probation (every chunk still checked) and, clean, turns healthy.
  const int n = 4;
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 4096;
  o.checksum = true;
  o.health_agree_every = 2;
  o.fault = "flip:rate=1e-4,link=0-1,until=60,seed=3";
  o.health.timings.fence_cooldown = std::chrono::milliseconds(150);
  o.health.timings.probation_duration = std::chrono::milliseconds(100);
  o.host_id = "checksum-probation";
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 60, 30000, LinkId{0, 1}, [](int it, Communicator&) {
    if (it >= 4) std::this_thread::sleep_for(std::chrono::milliseconds(15));  // let the cool-down pass
  }, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const PlanOutcome& o_r = out[static_cast<std::size_t>(r)];
    REQUIRE(o_r.fenced_at == out[0].fenced_at);
    REQUIRE(o_r.fenced_at > 0);
    REQUIRE(o_r.readmitted_at > o_r.fenced_at);  // after the cool-down, at the same collective everywhere
    REQUIRE(o_r.readmitted_at == out[0].readmitted_at);
    REQUIRE(o_r.fences.empty());
    REQUIRE(o_r.ring == std::vector<int>{0, 1, 2, 3});
    REQUIRE(o_r.epoch == 2);
    // Both ends of the link judge it: their policies served the cool-down, then clean probation
    // made it healthy again. Nobody else watches link 0-1.
    if (r <= 1) REQUIRE(o_r.healthy_at > o_r.readmitted_at);
    else REQUIRE(o_r.healthy_at == 0);
  }
}

namespace {
// `iterations` in-place int32 sum allreduces of `count` verifiable elements: the wrong elements.
std::size_t int_sum_allreduces(Communicator& comm, std::size_t count, int iterations) {
  std::vector<std::int32_t> buf(count);
  std::size_t wrong = 0;
  for (int it = 0; it < iterations; ++it) {
    test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), comm.size(), buf.data(), buf.size());
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
    wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, comm.size(), buf.data(), buf.size());
  }
  return wrong;
}
}  // namespace

// Left out of the tsan test preset (docs/sanitizers.md): under TSan the links' speeds vary too
// much between agreements to judge any of them.
TEST_CASE("a link far slower than the job's other links is named slow, fenced and relayed around, with exact results",
          "[integrity][health][bandwidth]") {
  const int n = 4;
  std::vector<std::string> slow(n);
  std::vector<int> stragglers(n, 0);
  std::vector<std::vector<LinkId>> fences(n);
  std::atomic<std::size_t> wrong{0};
  CommOptions o;  // the defaults: checksums and health on
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 64 * 1024;  // writes long enough to be timed
  o.health_agree_every = 1;
  o.fault = "throttle:mbps=100,link=0-1";  // 100 MB/s; the other links run at memory speed
  o.host_id = "bandwidth";
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.a == 0 && e.b == 1 && e.kind == EventKind::LinkSlow) slow[r] = e.detail;
      if (e.kind == EventKind::Straggler) ++stragglers[r];
    });
    wrong += int_sum_allreduces(comm, 1 << 20, 6);  // 4 MiB: 3 MiB per link per allreduce, 48 timed writes
    fences[r] = comm.fenced_links();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << slow[static_cast<std::size_t>(r)]);
    // Rank 0 writes over 0-1 (ring 0-1-2-3) and times its writes; every rank reads them in the ballot.
    REQUIRE_THAT(slow[static_cast<std::size_t>(r)], Catch::Contains("writes from rank 0 at") && Catch::Contains("GB/s"));
    REQUIRE(std::find(fences[static_cast<std::size_t>(r)].begin(), fences[static_cast<std::size_t>(r)].end(), LinkId{0, 1}) !=
            fences[static_cast<std::size_t>(r)].end());
    REQUIRE(stragglers[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("a rank slow on all of its links is named a straggler and no link is fenced", "[integrity][health][bandwidth]") {
  const int n = 4;
  std::vector<std::string> straggler(n);
  std::vector<int> slow_events(n, 0);
  std::vector<std::vector<LinkId>> fences(n);
  std::atomic<std::size_t> wrong{0};
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 64 * 1024;
  o.health_agree_every = 1;
  o.fault = "delay:us=1500,link=1-2;delay:us=1500,link=2-3";  // rank 2's ring links, both directions
  o.host_id = "straggler";
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::Straggler && e.count == 2) straggler[r] = e.detail;
      if (e.kind == EventKind::LinkSlow) ++slow_events[r];
    });
    wrong += int_sum_allreduces(comm, 1 << 19, 5);
    fences[r] = comm.fenced_links();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(straggler[static_cast<std::size_t>(r)], Catch::Contains("rank 2 is a straggler"));
    REQUIRE(slow_events[static_cast<std::size_t>(r)] == 0);
    REQUIRE(fences[static_cast<std::size_t>(r)].empty());
  }
}

TEST_CASE("two ranks propose different fences at once: every rank agrees on both", "[integrity][health]") {
  // Links 0-1 and 2-3 corrupt at the same time; ranks 1 and 3 propose different fences in the
  // same agreement. Every rank must install the same union and the same relays, and the float
  // results must stay byte-identical to the fault-free run.
  const int n = 5;
  const auto [clean, faulty] =
      test::run_against_clean(n, "flip:rate=1e-4,link=0-1,seed=5;flip:rate=1e-4,link=2-3,seed=6", {}, builtin_transports(), 16, 20000);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    std::vector<LinkId> fences = faulty.fences[r];
    std::sort(fences.begin(), fences.end(), [](LinkId x, LinkId y) { return x.a != y.a ? x.a < y.a : x.b < y.b; });
    REQUIRE(fences == std::vector<LinkId>{LinkId{0, 1}, LinkId{2, 3}});
    REQUIRE(faulty.relays[r] == faulty.relays[0]);
    REQUIRE(faulty.relays[r].size() == 2);
    REQUIRE(faulty.errors_after_first_epoch[r] == 0);
  }
}

TEST_CASE("with two ranks a link that must be fenced has no route around: it stays in use, checksummed, exact",
          "[integrity][health]") {
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.health_agree_every = 2;
  o.fault = "flip:rate=1e-4,link=0-1,seed=9";
  o.host_id = "noplan";
  std::vector<std::string> no_plan(2);
  std::atomic<std::size_t> wrong{0}, caught{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    comm.on_health_event([&](const HealthEvent& e) {
      if (e.kind == EventKind::NoPlan) no_plan[static_cast<std::size_t>(comm.rank())] = e.detail;
    });
    std::vector<float> buf(20000);
    for (int it = 0; it < 20; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 2, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 2, buf.data(), buf.size());
    }
    T_CHECK(comm.fenced_links().empty());
    for (const auto& l : comm.links()) caught += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(caught > 0);  // the link really corrupted chunks after the decision
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(no_plan[static_cast<std::size_t>(r)],
                 Catch::Contains("links 0-1 must be fenced") && Catch::Contains("stay in use, degraded"));
  }
}

TEST_CASE("without checksums, a counter storm on a link with no route around turns checksums on, results stay exact",
          "[integrity][health][nvml]") {
  // Two ranks, checksums off, link 0-1 mapped to a fake NVLink. The link storms between
  // collectives #6 and #7; the agreement at #8 must fence it, finds no plan, and switches
  // checksums on instead. From 4 s after connecting the link also flips bits: only the
  // checksums keep the later results exact.
  const test::FakeNvmlState nvml("ringfence-noplan", "count 1\nlinks 1\n");
  const int n = 2;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0}, caught{0};
  std::vector<std::string> no_plan(n);
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.checksum = false;
  o.health_agree_every = 2;
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_link_map = "0-1=nvml:0:0";
  o.fault = "flip:rate=1e-4,link=0-1,seed=3,at_ms=4000";
  o.host_id = "noplan-nvml";
  const auto start = std::chrono::steady_clock::now();
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::NoPlan) no_plan[r] = e.detail;
    });
    std::vector<std::int32_t> buf(10000);
    for (int it = 0; it < 24; ++it) {
      if (it == 6) {
        sync.arrive_and_wait();
        if (r == 0) nvml.write("count 1\nlinks 1\nd0.l0.crc_flit 250000\nd0.l0.replay 7\n");
        sync.arrive_and_wait();
      }
      if (it == 12) {  // the link starts flipping bits
        sync.arrive_and_wait();
        std::this_thread::sleep_until(start + std::chrono::milliseconds(4500));
      }
      test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    T_CHECK(comm.fenced_links().empty());
    for (const auto& l : comm.links()) caught += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(caught > 0);  // damaged chunks arrived and were caught
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(no_plan[static_cast<std::size_t>(r)], Catch::Contains("checksums switched on"));
  }
}

namespace {
// Options for thread ranks on the fake NVML with the automatic NVLink map (`map`) or none, on
// host `host`, agreements every 2 collectives, no background sampling.
CommOptions fake_nvml_options(const char* host, bool map) {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  if (map) o.health_link_map = "auto";
  o.health_interval = std::chrono::milliseconds(0);
  o.host_id = host;
  return o;
}

// Per-rank options: `o` with RINGFENCE_HEALTH_GPU = gpu(rank).
std::function<CommOptions(int)> per_rank_gpu(const CommOptions& o, std::function<int(int)> gpu) {
  return [o, gpu](int r) {
    CommOptions mine = o;
    mine.health_gpu = gpu(r);
    return mine;
  };
}

// Fake NVML state: four GPUs with bus ids 0000:2g:00.0 and one NVLink each, bridging 0-2 and 1-3.
std::string bridged_gpus() {
  std::string topo = "count 4\nlinks 1\n";
  for (int g = 0; g < 4; ++g)
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\nd{0}.l0.remote 0000:{2:02x}:00.0\n", g, 0x20 + g, 0x20 + (g + 2) % 4);
  return topo;
}

// Runs `iterations` exact sum allreduces of `count` elements of `type` on `comm`. Before
// collective `at` (0-based) all ranks meet at `meet()`, rank 0 calls `change()` (a new fake NVML
// state), and all meet again, so every rank runs the same collectives before and after the
// change. Returns the number of wrong elements.
std::size_t allreduces_changing_at(Communicator& comm, int iterations, int at, DataType type, std::size_t count,
                                   const std::function<void()>& meet, const std::function<void()>& change) {
  const int n = comm.size();
  std::vector<std::byte> buf(count * size_of(type));
  std::size_t wrong = 0;
  for (int it = 0; it < iterations; ++it) {
    if (it == at) {
      meet();
      if (comm.rank() == 0) change();
      meet();
    }
    test::fill_input(type, ReduceOp::Sum, comm.rank(), n, buf.data(), count);
    comm.allreduce(buf.data(), buf.data(), count, type, ReduceOp::Sum);
    wrong += test::count_wrong(type, ReduceOp::Sum, n, buf.data(), count);
  }
  return wrong;
}
}  // namespace

TEST_CASE("a counter storm on the fake NVML fences the mapped link and relays around it", "[health][nvml][e2e]") {
  const test::FakeNvmlState nvml("ringfence-storm", "count 1\nlinks 4\n");
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<int>> rings(n);
  std::vector<std::vector<Relay>> relays(n);
  std::vector<std::uint64_t> fenced_at(n, 0);
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_link_map = "1-2=nvml:0:1";  // the NVLink behind ring edge 1-2
  o.host_id = "storm";
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::LinkFenced) fenced_at[r] = e.sequence;
    });
    // Between collectives #6 and #7 the NVLink starts replaying.
    wrong += allreduces_changing_at(comm, 12, 6, DataType::Int32, 10000, [&] { sync.arrive_and_wait(); },
                                    [&] { nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n"); });
    fences[r] = comm.fenced_links();
    rings[r] = comm.ring();
    relays[r] = comm.relays();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{1, 2}});
    REQUIRE(fenced_at[r] == 8);  // first agreement after the storm (agreements at 2, 4, 6, 8, ...)
    REQUIRE(rings[r] == rings[0]);
    REQUIRE(relays[r] == std::vector<Relay>{Relay{1, 0, 2}});  // hop 1 -> 2 now goes through rank 0
  }
}

TEST_CASE("RINGFENCE_HEALTH_LINK_MAP=auto maps NVLinks from NVML's topology, a storm on one fences its ranks' link",
          "[health][nvml][e2e][topology]") {
  // Four ranks, one GPU each (NVML index = rank), NVLinks in a ring: link 0 of GPU g joins GPU
  // g+1, link 1 joins GPU g-1. GPU 1's link 1 (to GPU 0) storms: only rank 1 reads it, and
  // only through the automatic map, so link 0-1 must be fenced.
  std::string topo = "count 4\nlinks 2\n";
  for (int g = 0; g < 4; ++g)
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\nd{0}.l0.remote 0000:{2:02x}:00.0\nd{0}.l1.remote 0000:{3:02x}:00.0\n", g,
                        0x10 + g, 0x10 + (g + 1) % 4, 0x10 + (g + 3) % 4);
  const test::FakeNvmlState nvml("ringfence-topology", topo);
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::string> proposal(n);
  const std::string error = test::run_ranks(
      n, per_rank_gpu(fake_nvml_options("topology", true), [](int r) { return r; }),
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::FenceProposed) proposal[r] = fmt::format("{}-{}", e.a, e.b);
        });
        wrong += allreduces_changing_at(comm, 8, 2, DataType::Int32, 10000, [&] { sync.arrive_and_wait(); },
                                        [&] { nvml.write(topo + "d1.l1.replay 3\n"); });
        fences[r] = comm.fenced_links();
      });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(proposal == std::vector<std::string>{"", "0-1", "", ""});  // only GPU 1 saw its link replay
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{0, 1}});
  }
}

TEST_CASE("the planner makes NVLink-bridged ranks ring neighbours, and a storm on a bridge is relayed around",
          "[health][nvml][e2e][topology][plan]") {
  // Four ranks, one GPU each (NVML index = rank), NVLink bridges 0-2 and 1-3 only. The home ring
  // must use both bridges (0, 1, 3, 2; rank order would use none). Bridge 1-3 then storms:
  // the automatic map fences ring hop 1 -> 3 and rank 0 relays it; results stay exact.
  const std::string topo = bridged_gpus();
  const test::FakeNvmlState nvml("ringfence-planner", topo);
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<int>> home(n), rings(n);
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<Relay>> relays(n);
  const std::string error = test::run_ranks(
      n, per_rank_gpu(fake_nvml_options("planner", true), [](int r) { return r; }),
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        home[r] = comm.ring();
        wrong += allreduces_changing_at(comm, 8, 2, DataType::Float32, 30000, [&] { sync.arrive_and_wait(); },
                                        [&] { nvml.write(topo + "d3.l0.replay 3\n"); });  // GPU 3's bridge to GPU 1
        rings[r] = comm.ring();
        fences[r] = comm.fenced_links();
        relays[r] = comm.relays();
      });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(home[r] == std::vector<int>{0, 1, 3, 2});
    REQUIRE(rings[r] == std::vector<int>{0, 1, 3, 2});
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{1, 3}});
    REQUIRE(relays[r] == std::vector<Relay>{Relay{1, 0, 3}});
  }
}

TEST_CASE("without a GPU named the planner keeps rank order, and one rank's unknown GPU breaks no agreement",
          "[health][nvml][e2e][topology][plan]") {
  // The same bridges, but rank 2 names no GPU: every rank learns only bridge 1-3, and the ring
  // is the lexicographically first that uses it, 0, 1, 3, 2. With no rank naming a GPU the
  // ranks ascend.
  const test::FakeNvmlState nvml("ringfence-planner-partial", bridged_gpus());
  const int n = 4;
  for (const bool any_gpu : {true, false}) {
    const test::PlannedRun run = test::plan_and_allreduce(
        n, per_rank_gpu(fake_nvml_options("planner", false), [&](int r) { return any_gpu && r != 2 ? r : -1; }));
    INFO("any_gpu " << any_gpu << ": " << run.error);
    REQUIRE(run.error.empty());
    REQUIRE(run.wrong == 0);
    for (const auto& ring : run.rings) REQUIRE(ring == (any_gpu ? std::vector<int>{0, 1, 3, 2} : std::vector<int>{0, 1, 2, 3}));
  }
}

TEST_CASE("GPUs on NVSwitches are joined: every rank learns which GPUs reach the switches and plans with it",
          "[health][nvml][e2e][topology][plan]") {
  // GPUs 0 and 2 have two active NVLinks each, both ending at an NVSwitch (whose far-end bus id
  // NVML leaves empty on link 1); GPUs 1 and 3 have none. Ranks 0 and 2 are joined through the
  // switches, so the ring is 0, 1, 3, 2 (rank order joins nobody). The switch links map to no
  // ring edge (they serve every pair of the GPU), which the automatic map must accept.
  std::string topo = "count 4\nlinks 2\n";
  for (int g = 0; g < 4; ++g) {
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\n", g, 0x40 + g);
    if (g % 2 == 0)
      topo += fmt::format("d{0}.l0.type switch\nd{0}.l0.remote 0000:c0:00.0\nd{0}.l1.type switch\n", g);
    else
      topo += fmt::format("d{0}.l0.state 0\nd{0}.l1.state 0\n", g);
  }
  const test::FakeNvmlState nvml("ringfence-planner-nvswitch", topo);
  const test::PlannedRun run = test::plan_and_allreduce(4, per_rank_gpu(fake_nvml_options("nvswitch", true), [](int r) { return r; }));
  INFO(run.error);
  REQUIRE(run.error.empty());
  REQUIRE(run.wrong == 0);
  for (const auto& ring : run.rings) REQUIRE(ring == std::vector<int>{0, 1, 3, 2});
}

TEST_CASE("a fenced link whose storm ended serves its cool-down and is readmitted: the original plan returns",
          "[health][nvml][e2e][probation]") {
  const test::FakeNvmlState nvml("ringfence-probation", "count 1\nlinks 4\n");
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health.window = std::chrono::milliseconds(100);            // the storm leaves the window quickly
  o.health.timings.fence_cooldown = std::chrono::milliseconds(150);
  o.health_link_map = "1-2=nvml:0:1";
  o.health_interval = std::chrono::milliseconds(0);
  o.host_id = "probation";
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 40, 10000, LinkId{1, 2}, [&](int it, Communicator& comm) {
    if (it == 4) {  // the NVLink replays once (a storm), then stays quiet
      sync.arrive_and_wait();
      if (comm.rank() == 0) nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n");
      sync.arrive_and_wait();
    }
    if (it >= 8) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the cool-down pass
  }, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const PlanOutcome& o_r = out[static_cast<std::size_t>(r)];
    REQUIRE(o_r.fenced_at == 6);                      // first agreement after the storm
    REQUIRE(o_r.readmitted_at > o_r.fenced_at);        // after the cool-down, at the same collective everywhere
    REQUIRE(o_r.readmitted_at == out[0].readmitted_at);
    REQUIRE(o_r.fences.empty());
    REQUIRE(o_r.ring == std::vector<int>{0, 1, 2, 3});  // the original plan, no relays
    REQUIRE(o_r.relays == 0);
    REQUIRE(o_r.epoch == 2);                           // fenced, then readmitted
  }
}

TEST_CASE("the background sampler reads the counter sources between collectives and stops with the communicator",
          "[health][nvml]") {
  const test::FakeNvmlState nvml("ringfence-sampler", "count 1\nlinks 2\n");
  auto store = std::make_shared<InProcessStore>();
  std::vector<std::uint64_t> samples(2, 0), after(2, 0);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::string error;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
        o.health_link_map = "0-1=nvml:0:0";
        o.health_interval = std::chrono::milliseconds(5);
        o.host_id = "sampler";
        {
          Communicator comm(store, r, 2, builtin_transports(), o);
          std::int32_t v = 1;
          comm.allreduce(&v, &v, 1, DataType::Int32, ReduceOp::Sum);
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          samples[r] = comm.health().background_samples;
          comm.barrier();
        }  // the sampler thread is joined here; nothing may touch freed state afterwards
        after[r] = 1;
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(samples[r] >= 5);  // ~30 expected at 5 ms over 150 ms; generous for a loaded box
    REQUIRE(after[r] == 1);
  }
}

TEST_CASE("the Prometheus text file shows the fenced link, its checksum errors and the epoch", "[health][prometheus]") {
  test::TempDir dir{"ringfence-prom"};
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.health_agree_every = 2;
  o.fault = "flip:rate=1e-4,link=0-1,seed=3";
  o.health_prometheus = (dir.path() / "ringfence-{rank}.prom").string();
  o.host_id = "prom";
  const std::string error = test::run_ranks(4, o, [&](Communicator& comm) {
    std::vector<float> buf(30000, 1.0f);
    for (int it = 0; it < 8; ++it) comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
  });
  INFO(error);
  REQUIRE(error.empty());
  std::ifstream in(dir.path() / "ringfence-1.prom");
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_THAT(text, Catch::Contains("# TYPE ringfence_link_checksum_errors_total counter"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_fenced_links{rank=\"1\"} 1"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_epoch{rank=\"1\"} 1"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_link_state{rank=\"1\",peer=\"0\",transport=\"shm\"} 3"));  // fenced
  REQUIRE_THAT(text, Catch::Contains("ringfence_relays{rank=\"1\"} 1"));
  REQUIRE_FALSE(std::filesystem::exists(dir.path() / "ringfence-1.prom.tmp"));
}

TEST_CASE("the fault decorator reports the inner transport's properties", "[fault]") {
  CommOptions options;
  options.host_id = "h";
  Logger log;
  const PeerInfo self{0, "h", 1};
  auto tcp_t = make_fault_transport(transports::tcp::make_transport(TransportContext{self, 2, &options, &log}),
                                    parse_fault_spec("flip:rate=1e-3,link=0-1"), 0);
  auto shm_t = make_fault_transport(transports::shm::make_transport(TransportContext{self, 2, &options, &log}),
                                    parse_fault_spec("flip:rate=1e-3,link=0-1"), 0);
  // The tuner and the direct-write paths read these through the decorator.
  CHECK(tcp_t->name() == "tcp");
  CHECK(tcp_t->traits().cheap_user_writes);
  CHECK_FALSE(tcp_t->traits().shares_memory);
  CHECK(shm_t->name() == "shm");
  CHECK_FALSE(shm_t->traits().cheap_user_writes);
  CHECK(shm_t->traits().shares_memory);
}
