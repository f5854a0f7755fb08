// End-to-end integrity: CRC32C, the fault-injection grammar, and corrupted links that never
// corrupt a result when checksums are on.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
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
  // Short inputs (under 256 bytes: every length from 64, so each tail of crc_sse42_short's
  // four-per-turn loop and each split of crc_three_short's three stretches, from 96, is met at
  // several alignments), the folding path (256 bytes per round,
  // 16-byte and ragged tails), the three-stream path (3072 bytes per round), at odd offsets too.
  std::vector<std::size_t> lengths{0u, 1u, 7u, 8u, 9u, 15u, 16u, 63u, 256u, 257u, 271u, 272u, 511u, 512u, 513u, 4099u, 3071u, 3072u,
                                   3073u, 6144u, 12288u, 20000u, 100000u,
                                   // 4-64 KiB: whole fold steps of 256 bytes and ragged lengths between them
                                   4095u, 4096u, 4097u, 4447u, 4448u, 4449u, 5000u, 33333u, 65535u, 65536u, 65537u};
  for (std::size_t len = 64; len < 256; ++len) lengths.push_back(len);
  for (std::size_t len : lengths) {
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

// The copy a carried allreduce checks (copy_crc_of_copy) copies under 256 bytes with masked
// 512-bit loads and stores where the CPU has them, and folds from 256: every length from 0 to
// past two fold steps, from four source and two destination offsets in a line, must copy
// exactly those bytes, return their CRC and write nothing around them.
TEST_CASE("copy_crc_of_copy copies and checks every length and writes nothing outside", "[integrity][crc32c]") {
  INFO("implementation: " << crc32c_implementation());
  std::mt19937 rng(29);
  constexpr std::size_t kMax = 600, kGuard = 256;
  std::vector<std::byte> src(kMax + 2 * kGuard), dst(kMax + 2 * kGuard);
  for (auto& x : src) x = static_cast<std::byte>(rng());
  for (std::size_t len = 0; len <= kMax; ++len) {
    for (std::size_t s_off : {std::size_t{0}, std::size_t{1}, std::size_t{40}, std::size_t{63}}) {
      for (std::size_t d_off : {std::size_t{0}, std::size_t{5}}) {
        CAPTURE(len, s_off, d_off);
        std::fill(dst.begin(), dst.end(), std::byte{0xa5});
        const std::byte* from = src.data() + kGuard + s_off;
        std::byte* to = dst.data() + kGuard + d_off;
        REQUIRE(detail::copy_crc_of_copy(to, from, len) == crc32c_portable(from, len));
        REQUIRE(std::memcmp(to, from, len) == 0);
        const auto untouched = [](std::byte x) { return x == std::byte{0xa5}; };
        REQUIRE(std::all_of(dst.begin(), dst.begin() + static_cast<std::ptrdiff_t>(kGuard + d_off), untouched));
        REQUIRE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(kGuard + d_off + len), dst.end(), untouched));
      }
    }
  }
}

TEST_CASE("checked copies and reductions give the pass's result and the CRCs of input and result", "[integrity][crc32c]") {
  INFO("implementation: " << crc32c_implementation());
  std::mt19937 rng(11);
  std::vector<std::byte> a(70000), b(70000), dst(70000), want(70000);
  for (auto& x : a) x = static_cast<std::byte>(rng());
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0x3f);  // small values: no overflow worries for exactness
  // Lengths around the 256-byte fold steps, the 2 KiB groups, the 8 KiB blocks and the 16 KiB
  // up to which a staging copy copies before it folds.
  for (std::size_t len : {0u, 1u, 16u, 255u, 256u, 257u, 2047u, 2048u, 2049u, 4095u, 4096u, 4100u, 4448u, 4708u, 8191u, 8192u, 8200u,
                          16383u, 16384u, 16385u, 33333u, 65535u, 65536u, 65537u, 69999u}) {
    CAPTURE(len);
    std::fill(dst.begin(), dst.end(), std::byte{0});
    REQUIRE(copy_bytes_crc(dst.data(), a.data() + 1, len) == crc32c_portable(a.data() + 1, len));
    REQUIRE(std::memcmp(dst.data(), a.data() + 1, len) == 0);
    std::fill(dst.begin(), dst.end(), std::byte{0});
    REQUIRE(detail::copy_crc_of_copy(dst.data(), a.data() + 1, len) == crc32c_portable(a.data() + 1, len));
    REQUIRE(std::memcmp(dst.data(), a.data() + 1, len) == 0);
    std::fill(dst.begin(), dst.end(), std::byte{0});
    REQUIRE(staging_copy_crc(dst.data() + 1, a.data() + 1, len) == crc32c_portable(a.data() + 1, len));
    REQUIRE(std::memcmp(dst.data() + 1, a.data() + 1, len) == 0);
    REQUIRE(std::all_of(dst.begin() + 1 + static_cast<std::ptrdiff_t>(len), dst.end(), [](std::byte x) { return x == std::byte{0}; }));
    for (const auto& [type, elem] : {std::pair{DataType::Uint8, std::size_t{1}}, std::pair{DataType::Float16, std::size_t{2}},
                                     std::pair{DataType::Int32, std::size_t{4}}, std::pair{DataType::Float32, std::size_t{4}},
                                     std::pair{DataType::Float64, std::size_t{8}}}) {
      const std::size_t count = len / elem, bytes = count * elem;
      const Reducer r = host_reducer(type, ReduceOp::Sum);
      r.combine(want.data(), a.data(), b.data(), count, 2);
      std::uint32_t crc_a = 0, crc_dst = 0;
      detail::combine_with_crc(r, false, dst.data(), a.data(), b.data(), count, 2, &crc_a, &crc_dst);
      REQUIRE(std::memcmp(dst.data(), want.data(), bytes) == 0);
      REQUIRE(crc_a == crc32c_portable(a.data(), bytes));
      REQUIRE(crc_dst == crc32c_portable(want.data(), bytes));
      // One CRC asked for (the engine leaves the result's to the send's copy where the link
      // computes it there): the other pointer is null, and the asked one is still right
      // (for float32 and the input's CRC, sum_f32_with_crc's single loop).
      std::uint32_t only = 0;
      std::fill(dst.begin(), dst.end(), std::byte{0});
      detail::combine_with_crc(r, false, dst.data(), a.data(), b.data(), count, 2, &only, nullptr);
      REQUIRE(std::memcmp(dst.data(), want.data(), bytes) == 0);
      REQUIRE(only == crc32c_portable(a.data(), bytes));
      only = 0;
      detail::combine_with_crc(r, false, dst.data(), a.data(), b.data(), count, 2, nullptr, &only);
      REQUIRE(only == crc32c_portable(want.data(), bytes));
      // In place (dst is a): the CRC of a is taken before the block is overwritten.
      std::vector<std::byte> inplace(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(bytes));
      detail::combine_with_crc(r, false, inplace.data(), inplace.data(), b.data(), count, 2, &crc_a, &crc_dst);
      REQUIRE(crc_a == crc32c_portable(a.data(), bytes));
      REQUIRE(crc_dst == crc32c_portable(want.data(), bytes));
    }
  }
}

TEST_CASE("the fused float sum gives the float kernels' bits and the CRC of its first operand", "[integrity][crc32c]") {
  INFO("implementation: " << crc32c_implementation());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1e3f, 1e3f);
  const std::size_t n = 70000;
  std::vector<float> a(n), b(n), dst(n + 1), want(n);  // dst: one more, to see nothing is written past the end
  for (auto& x : a) x = value(rng);  // sums round: the bits must match the kernel's, not a formula's
  for (auto& x : b) x = value(rng);
  const Reducer r = host_reducer(DataType::Float32, ReduceOp::Sum);
  const auto* ab = reinterpret_cast<const std::byte*>(a.data());
  const auto* bb = reinterpret_cast<const std::byte*>(b.data());
  auto* db = reinterpret_cast<std::byte*>(dst.data());
  bool fused_somewhere = false;
  for (std::size_t count : {0u, 1u, 63u, 64u, 65u, 127u, 1000u, 1023u, 1024u, 1025u, 1112u, 1177u, 8333u, 16383u, 16384u, 16385u,
                            65536u, 65537u, 70000u}) {
    CAPTURE(count);
    r.combine(want.data(), a.data(), b.data(), count, 2);
    std::fill(dst.begin(), dst.end(), -0.0f);
    std::uint32_t crc = 0;
    // Either source: the pass prefetches `a` or not (CheckedSource), the same bits either way.
    const auto from = count % 2 ? detail::CheckedSource::Memory : detail::CheckedSource::Cache;
    const bool fused = detail::sum_f32_with_crc(r.combine, db, ab, bb, count, &crc, from);
    const std::size_t bytes = count * sizeof(float);
    if (!fused) {  // nothing done: the caller takes the generic path
      REQUIRE(std::all_of(dst.begin(), dst.end(), [](float x) { return std::signbit(x) && x == 0.0f; }));
      REQUIRE((bytes < 256 || bytes > (std::size_t{256} << 10) || std::string(crc32c_implementation()) != "avx512-vpclmulqdq"));
      continue;
    }
    fused_somewhere = true;
    REQUIRE(std::memcmp(dst.data(), want.data(), bytes) == 0);
    REQUIRE(crc == crc32c_portable(ab, bytes));
    REQUIRE(std::signbit(dst[count]));  // nothing written past the end
  }
  if (std::string(crc32c_implementation()) == "avx512-vpclmulqdq") REQUIRE(fused_somewhere);
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
  // Staged chunks, over the carried allreduce's 4 KiB: the injector flips at most the first 32
  // bytes of a write, which in a carried post are its fingerprint, and its data then passes.
  const Outcome r = run_with_faults(2, o, 2000, 1);
  REQUIRE_THAT(r.error, Catch::Contains("checksum") && Catch::Contains("rank"));
  REQUIRE(r.wrong == 0);  // nobody returned a result
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

// A chunk's trailer rides in its data signal on shm (SignalOp::with): flips must reach those
// bytes as they reach written ones, or checksums would go untested on half of what a chunk sends.
TEST_CASE("the fault decorator flips the bytes a signal carries, in a copy", "[fault]") {
  CommOptions options;
  options.host_id = "h";
  Logger log;
  const PeerInfo pa{0, "h", static_cast<std::int32_t>(::getpid())}, pb{1, "h", static_cast<std::int32_t>(::getpid())};
  auto a = make_fault_transport(transports::shm::make_transport(TransportContext{pa, 2, &options, &log}),
                                parse_fault_spec("flip:rate=1,link=0-1"), 0);
  auto b = transports::shm::make_transport(TransportContext{pb, 2, &options, &log});
  REQUIRE(a->traits().signals_carry_bytes);
  auto la = a->listen(), lb = b->listen();
  std::unique_ptr<Link> link;
  REQUIRE(a->connect(*la, pb, lb->address())->try_finish(link).is_ok());
  auto* mem = static_cast<std::byte*>(b->allocate(sizeof(SignalFlag), MemoryKind::Host));
  MemoryRegion region = b->register_memory(mem, sizeof(SignalFlag), MemoryKind::Host);
  RemoteRegion remote = a->import_region(region.key());
  const std::uint8_t one = 0x5a;  // rules count writes: the first one starts the rule's window
  REQUIRE(link->write(WriteOp{&one, nullptr, &remote, 60, 1, 1}).is_ok());
  std::uint8_t carried[12], kept[12];
  for (int i = 0; i < 12; ++i) carried[i] = kept[i] = static_cast<std::uint8_t>(i * 17 + 3);
  SignalOp op{&remote, 0, 7, 2};
  op.with = carried;
  op.with_offset = 8;
  op.with_bytes = sizeof carried;
  REQUIRE(link->signal(op).is_ok());
  REQUIRE(reinterpret_cast<SignalFlag*>(mem)->value.load() == 7);  // the flag itself is not damaged
  for (int i = 0; i < 12; ++i) REQUIRE(static_cast<std::uint8_t>(mem[8 + i]) != kept[i]);  // rate 1: every byte
  REQUIRE(std::memcmp(carried, kept, sizeof kept) == 0);  // the caller's bytes stay as they were
  std::vector<Completion> done(8);
  std::size_t n = 0;
  REQUIRE(link->poll(done, n).is_ok());
}
