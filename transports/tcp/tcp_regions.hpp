#pragma once
// Memory regions of the tcp transport: an entry of the registration table (read by whoever
// places payloads), the local region handle and the imported remote region.
#include <cstddef>
#include <cstdint>
#include <ringfence/transport.hpp>

namespace ringfence::transports::tcp::detail {

// A registered local region: the progress thread writes into it.
struct RegionEntry {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  bool live = false;
};

class TcpTransport;
class TcpLink;

struct LocalRegion final : MemoryRegion::Impl {
  TcpTransport* owner = nullptr;
  std::uint32_t id = 0;
  std::size_t bytes = 0;
  Bytes key() const override;
  ~LocalRegion() override;
};

struct Remote final : RemoteRegion::Impl {
  std::uint32_t id = 0;
};

}  // namespace ringfence::transports::tcp::detail
