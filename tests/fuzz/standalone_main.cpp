// Runs a libFuzzer-style target without libFuzzer (any compiler, every CI run): first every
// file of the seed corpus directories given on the command line, then a bounded number of
// deterministic mutations of them (byte flips, insertions, deletions, splices, random bytes,
// interesting values). A crash or trap fails the test; the seed of the failing input is
// printed so it can be reproduced. Longer runs use the libFuzzer build (tests/fuzz/README.md).
//   fuzz_<name> [--iterations N] [--seed S] CORPUS_DIR...
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Input = std::vector<std::uint8_t>;

Input mutate(const std::vector<Input>& pool, std::mt19937_64& rng) {
  Input in = pool.empty() ? Input{} : pool[rng() % pool.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  static const std::uint8_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, '=', ',', ':', ';', '-', '.', 'e', '0', '9', '\n', ' '};
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 7) {
      case 0:
        if (!in.empty()) in[rng() % in.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
        break;
      case 1: in.insert(in.begin() + static_cast<std::ptrdiff_t>(in.empty() ? 0 : rng() % (in.size() + 1)), static_cast<std::uint8_t>(rng())); break;
      case 2:
        if (!in.empty()) in.erase(in.begin() + static_cast<std::ptrdiff_t>(rng() % in.size()));
        break;
      case 3:
        if (!pool.empty()) {  // splice a piece of another input
          const Input& other = pool[rng() % pool.size()];
          if (!other.empty()) {
            const std::size_t from = rng() % other.size(), len = 1 + rng() % (other.size() - from);
            in.insert(in.begin() + static_cast<std::ptrdiff_t>(in.empty() ? 0 : rng() % (in.size() + 1)), other.begin() + static_cast<std::ptrdiff_t>(from),
                      other.begin() + static_cast<std::ptrdiff_t>(from + len));
          }
        }
        break;
      case 4:
        if (!in.empty()) in[rng() % in.size()] = kInteresting[rng() % sizeof kInteresting];
        break;
      case 5:
        if (in.size() > 1) in.resize(rng() % in.size());
        break;
      default:
        for (std::size_t k = rng() % 16; k > 0; --k) in.push_back(static_cast<std::uint8_t>(rng()));
    }
  }
  if (in.size() > 4096) in.resize(4096);
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 20000;
  std::uint64_t seed = 1;
  std::vector<Input> pool;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      for (const auto& f : std::filesystem::directory_iterator(argv[i])) {
        std::ifstream in(f.path(), std::ios::binary);
        pool.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    }
  }
  for (const Input& in : pool) LLVMFuzzerTestOneInput(in.data(), in.size());
  std::mt19937_64 rng(seed);
  for (long it = 0; it < iterations; ++it) {
    const Input in = mutate(pool, rng);
    LLVMFuzzerTestOneInput(in.data(), in.size());
    if (it % 64 == 0 && in.size() < 256) pool.push_back(in);  // grow the pool a little
    if (pool.size() > 512) pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pool.size() / 2));
  }
  std::printf("%zu seeds and %ld mutated inputs (seed %llu): no crash\n", pool.size(), iterations,
              static_cast<unsigned long long>(seed));
  return 0;
}
