// Memory regions of the tcp transport: registration (the table the receive path reads), region
// keys, and their import on the writing side.
#include <cstring>
#include <memory>
#include <mutex>
#include <ringfence/error.hpp>

#include "tcp_transport.hpp"

namespace ringfence::transports::tcp::detail {
namespace {

Bytes encode_region_key(std::uint32_t id, std::uint64_t bytes) {
  Bytes out(16);
  const std::uint32_t magic = kFrameMagic;
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &id, 4);
  std::memcpy(out.data() + 8, &bytes, 8);
  return out;
}

}  // namespace

Bytes LocalRegion::key() const { return encode_region_key(id, bytes); }
LocalRegion::~LocalRegion() {
  if (owner) owner->deregister(id);
}

MemoryRegion TcpTransport::register_memory(void* ptr, std::size_t bytes, MemoryKind kind) {
  RINGFENCE_EXPECTS(kind == MemoryKind::Host, "tcp: cannot register {} memory", to_string(kind));
  RINGFENCE_EXPECTS(ptr != nullptr || bytes == 0, "tcp: register_memory(nullptr, {})", bytes);
  std::lock_guard lock(regions_mutex_);
  std::uint32_t id = 0;
  while (id < regions_.size() && regions_[id].live) ++id;
  if (id == regions_.size()) regions_.push_back({});
  regions_[id] = RegionEntry{static_cast<std::byte*>(ptr), bytes, true};
  auto impl = std::make_unique<LocalRegion>();
  impl->owner = this;
  impl->id = id;
  impl->bytes = bytes;
  return MemoryRegion(std::move(impl), ptr, bytes, kind);
}

void TcpTransport::deregister(std::uint32_t id) noexcept {
  std::lock_guard lock(regions_mutex_);
  if (id < regions_.size()) regions_[id] = RegionEntry{};
}

RemoteRegion TcpTransport::import_region(std::span<const std::byte> key) {
  RINGFENCE_EXPECTS(key.size() == 16, "tcp: malformed region key ({} bytes)", key.size());
  std::uint32_t magic = 0, id = 0;
  std::uint64_t bytes = 0;
  std::memcpy(&magic, key.data(), 4);
  std::memcpy(&id, key.data() + 4, 4);
  std::memcpy(&bytes, key.data() + 8, 8);
  RINGFENCE_EXPECTS(magic == kFrameMagic, "tcp: malformed region key (magic)");
  auto remote = std::make_unique<Remote>();
  remote->id = id;
  return RemoteRegion(std::move(remote), bytes);
}

}  // namespace ringfence::transports::tcp::detail
