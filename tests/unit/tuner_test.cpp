// The allreduce tuner: pure model, same answer on every rank, overrides and plan limits.
#include <ringfence/tuner.hpp>

#include "support/catch.hpp"

using namespace ringfence;

TEST_CASE("tuner: tree for small messages on many ranks, ring for large ones and small rings", "[tuner]") {
  const TunerModel m{};
  REQUIRE(tree_depth(1) == 0);
  REQUIRE(tree_depth(2) == 1);
  REQUIRE(tree_depth(5) == 3);
  REQUIRE(tree_depth(8) == 3);
  // Two ranks: tree and direct are the ring; one-shot (one hop) wins tiny messages. Three: the
  // tree has the ring's latency (depth 2 vs 2 hops) and moves more bytes.
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 2, 8, true, true) == Algorithm::OneShot);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 2, 8, true, false) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 2, std::size_t{1} << 20, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Direct, 2, 8, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 3, 8, true, false) == Algorithm::Ring);
  for (int n : {4, 8, 16, 64}) {
    INFO("n=" << n);
    REQUIRE(choose_allreduce(m, Algorithm::Auto, n, 8, true, true) != Algorithm::Ring);
    REQUIRE(choose_allreduce(m, Algorithm::Auto, n, std::size_t{256} << 20, true, true) == Algorithm::Ring);
    // One crossover: once the ring wins it keeps winning as messages grow.
    bool ring_seen = false;
    for (std::size_t b = 8; b <= (std::size_t{1} << 30); b *= 2) {
      const Algorithm a = choose_allreduce(m, Algorithm::Auto, n, b, true, true);
      if (a == Algorithm::Ring) ring_seen = true;
      else REQUIRE_FALSE(ring_seen);
    }
  }
  // The crossover grows with the rank count (the ring's latency grows linearly).
  auto crossover = [&](int n) {
    std::size_t b = 8;
    while (choose_allreduce(m, Algorithm::Auto, n, b, true, true) != Algorithm::Ring) b *= 2;
    return b;
  };
  REQUIRE(crossover(8) > crossover(4));
  REQUIRE(crossover(64) > crossover(8));
}

TEST_CASE("tuner: explicit requests win unless the plan forbids the tree", "[tuner]") {
  const TunerModel m{};
  REQUIRE(choose_allreduce(m, Algorithm::Ring, 8, 8, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Tree, 8, std::size_t{1} << 30, true, true) == Algorithm::Tree);
  REQUIRE(choose_allreduce(m, Algorithm::Tree, 8, 8, false, false) == Algorithm::Ring);  // relayed plan
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 8, false, false) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Tree, 2, 8, true, true) == Algorithm::Ring);
  // Model terms: latency dominates at 8 bytes, bandwidth at 1 GiB.
  REQUIRE(predict_ring_us(m, 8, 8) > predict_tree_us(m, 8, 8));
  REQUIRE(predict_ring_us(m, 8, std::size_t{1} << 30) < predict_tree_us(m, 8, std::size_t{1} << 30));
}

TEST_CASE("tuner: one-shot for tiny messages, tree and direct for medium ones, the ring for bulk",
          "[tuner]") {
  const TunerModel m{};
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 4, 65536, true, true) == Algorithm::Direct);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 131072, true, true) == Algorithm::Direct);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 8192, true, true) == Algorithm::Tree);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 8, true, true) == Algorithm::OneShot);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 64, 64, true, true) == Algorithm::Tree);  // (n+1)/2 > 2 log2 n hops
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, std::size_t{16} << 20, true, true) == Algorithm::Ring);
  // A fence anywhere rules direct and one-shot out; a relayed plan rules the tree out too.
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 8, true, false) == Algorithm::Tree);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 131072, true, false) != Algorithm::Direct);
  REQUIRE(choose_allreduce(m, Algorithm::Auto, 8, 4096, false, false) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Direct, 8, 4096, true, false) == Algorithm::Ring);
  REQUIRE(choose_allreduce(m, Algorithm::Direct, 8, std::size_t{1} << 30, true, true) == Algorithm::Direct);
}

TEST_CASE("tuner: the model alone, network figures move the two-rank one-shot crossover up, not to bulk sizes", "[tuner]") {
  const TunerModel model{6.0, 2.0, 0};  // the shared-memory figures, the model alone
  const TunerModel tcp{25.0, 1.25, 0};  // across hosts or tcp only (the communicator's network figures)
  auto crossover = [](const TunerModel& m) {
    std::size_t b = 8;
    while (choose_allreduce(m, Algorithm::Auto, 2, b, true, true) != Algorithm::Ring) b *= 2;
    return b;
  };
  // One-shot wins while its extra volume (2S vs S) costs less than the hop it saves: S/beta < alpha.
  REQUIRE(crossover(model) == 16384);  // 8 KiB < 6 us * 2 GB/s = 12 KB < 16 KiB
  REQUIRE(crossover(tcp) == 32768);    // 16 KiB < 25 us * 1.25 GB/s = 31.25 KB < 32 KiB
  REQUIRE(choose_allreduce(tcp, Algorithm::Auto, 2, std::size_t{1} << 20, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(tcp, Algorithm::Auto, 2, 8, true, false) == Algorithm::Ring);  // a fence rules it out
}

TEST_CASE("tuner: two ranks on shared memory run one-shot up to the measured 48 KiB", "[tuner]") {
  const TunerModel shm{};  // the defaults
  // Past the model's 8 KiB, up to the measured limit: one hop of the whole message beats two
  // ring hops of chunks under ~24 KiB (docs/tuning.md, "Two ranks").
  for (std::size_t b : {std::size_t{8}, std::size_t{16384}, std::size_t{32768}, std::size_t{49152}}) {
    INFO("bytes=" << b);
    REQUIRE(choose_allreduce(shm, Algorithm::Auto, 2, b, true, true) == Algorithm::OneShot);
  }
  REQUIRE(choose_allreduce(shm, Algorithm::Auto, 2, 49153, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(shm, Algorithm::Auto, 2, 65536, true, true) == Algorithm::Ring);
  // Only Auto, only two ranks, only with every link trusted.
  REQUIRE(choose_allreduce(shm, Algorithm::Ring, 2, 32768, true, true) == Algorithm::Ring);
  REQUIRE(choose_allreduce(shm, Algorithm::Auto, 2, 32768, true, false) == Algorithm::Ring);
  REQUIRE(choose_allreduce(shm, Algorithm::Auto, 4, 32768, true, true) == choose_allreduce(TunerModel{6.0, 2.0, 0}, Algorithm::Auto, 4, 32768, true, true));
  REQUIRE(choose_allreduce(shm, Algorithm::Auto, 3, 32768, true, true) == Algorithm::Ring);
}
