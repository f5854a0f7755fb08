#pragma once
// Shared by the collective tests: small pipeline chunks (many steps, slot reuse), buffers with a
// guard byte that must survive, the element counts every collective is run with.
#include <cstddef>
#include <ringfence/options.hpp>
#include <string>
#include <vector>

namespace ringfence::test {

inline constexpr std::byte kGuard{0x5a};
inline const std::size_t kCounts[] = {0, 1, 5, 1031};

inline CommOptions small_chunks(bool checksum = false) {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 256;  // many pipeline steps and slot reuse
  o.checksum = checksum;
  return o;
}

// Buffer of `bytes` followed by a guard byte that must survive.
struct Guarded {
  explicit Guarded(std::size_t bytes, std::byte fill = std::byte{0}) : data(bytes + 1, fill) { data[bytes] = kGuard; }
  std::byte* get() { return data.data(); }
  bool intact() const { return data.back() == kGuard; }
  std::vector<std::byte> data;
};

inline std::string describe(int n, bool checksum) { return "ranks " + std::to_string(n) + (checksum ? " checksum" : ""); }

}  // namespace ringfence::test
