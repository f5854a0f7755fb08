#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/transport.hpp>

namespace ringfence {

std::string_view to_string(LinkState state) noexcept {
  switch (state) {
    case LinkState::Connecting: return "connecting";
    case LinkState::Up: return "up";
    case LinkState::Degraded: return "degraded";
    case LinkState::Fenced: return "fenced";
    case LinkState::Closed: return "closed";
  }
  return "unknown";
}

// Layout: int32 rank, int32 pid, uint32 host_id length, host_id bytes (little-endian host order).
Bytes serialize(const PeerInfo& info) {
  Bytes out(12 + info.host_id.size());
  const std::int32_t rank = info.rank, pid = info.pid;
  const std::uint32_t len = static_cast<std::uint32_t>(info.host_id.size());
  std::memcpy(out.data(), &rank, 4);
  std::memcpy(out.data() + 4, &pid, 4);
  std::memcpy(out.data() + 8, &len, 4);
  std::memcpy(out.data() + 12, info.host_id.data(), info.host_id.size());
  return out;
}

PeerInfo deserialize_peer_info(std::span<const std::byte> bytes) {
  RINGFENCE_EXPECTS(bytes.size() >= 12, "malformed peer info: {} bytes", bytes.size());
  PeerInfo info;
  std::uint32_t len = 0;
  std::memcpy(&info.rank, bytes.data(), 4);
  std::memcpy(&info.pid, bytes.data() + 4, 4);
  std::memcpy(&len, bytes.data() + 8, 4);
  RINGFENCE_EXPECTS(len == bytes.size() - 12, "malformed peer info: host id length {} in {} bytes", len, bytes.size());
  info.host_id.assign(reinterpret_cast<const char*>(bytes.data() + 12), len);
  return info;
}

}  // namespace ringfence
