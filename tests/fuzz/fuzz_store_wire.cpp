// Fuzz target: the bootstrap store's request parser (src/store_wire.cpp), fed the input in
// pieces as a socket would deliver it. It must report frames or Malformed, never read past its
// input, never hold more than one bounded frame.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ringfence/store.hpp>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kMaxValue = 1 << 16;
  ringfence::store_wire::RequestParser parser(kMaxValue);
  // The first byte picks the piece size, so the fuzzer explores frames split anywhere.
  const std::size_t piece = size ? static_cast<std::size_t>(data[0] % 17) + 1 : 1;
  std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data), size);
  while (!all.empty()) {
    std::span<const std::byte> in = all.first(std::min(piece, all.size()));
    all = all.subspan(in.size());
    while (!in.empty()) {
      const std::size_t before = in.size();
      const auto r = parser.feed(in);
      if (in.size() > before) __builtin_trap();
      if (r == ringfence::store_wire::ParseResult::Malformed) return 0;  // the server closes the connection
      if (r == ringfence::store_wire::ParseResult::Frame) {
        if (parser.key().size() > ringfence::kMaxStoreKeyBytes || parser.value().size() > kMaxValue) __builtin_trap();
      } else if (in.size() == before) {
        break;  // NeedMore with nothing consumed: wait for the next piece
      }
    }
  }
  return 0;
}
