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

// Layout (host byte order): int32 rank, int32 pid, then length-prefixed strings (uint32 length,
// bytes): host_id, gpu_bus_id, then uint32 count and that many NVLink bus ids, then uint32
// nvswitch_links, then int32 cpu.
namespace {

void put_u32(Bytes& out, std::uint32_t v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + 4);
}

void put_string(Bytes& out, const std::string& s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

struct Reader {
  std::span<const std::byte> bytes;
  std::size_t at = 0;
  std::uint32_t u32(const char* what) {
    RINGFENCE_EXPECTS(bytes.size() - at >= 4, "malformed peer info: {} bytes, {} cut off", bytes.size(), what);
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  }
  std::string string(const char* what) {
    const std::uint32_t len = u32(what);
    RINGFENCE_EXPECTS(len <= bytes.size() - at, "malformed peer info: {} length {} with {} bytes left", what, len,
                      bytes.size() - at);
    std::string s(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
    return s;
  }
};

}  // namespace

Bytes serialize(const PeerInfo& info) {
  Bytes out;
  put_u32(out, static_cast<std::uint32_t>(info.rank));
  put_u32(out, static_cast<std::uint32_t>(info.pid));
  put_string(out, info.host_id);
  put_string(out, info.gpu_bus_id);
  put_u32(out, static_cast<std::uint32_t>(info.nvlink_bus_ids.size()));
  for (const auto& b : info.nvlink_bus_ids) put_string(out, b);
  put_u32(out, info.nvswitch_links);
  put_u32(out, static_cast<std::uint32_t>(info.cpu));
  return out;
}

PeerInfo deserialize_peer_info(std::span<const std::byte> bytes) {
  Reader in{bytes};
  PeerInfo info;
  info.rank = static_cast<std::int32_t>(in.u32("rank"));
  info.pid = static_cast<std::int32_t>(in.u32("pid"));
  info.host_id = in.string("host id");
  info.gpu_bus_id = in.string("GPU bus id");
  const std::uint32_t links = in.u32("NVLink count");
  RINGFENCE_EXPECTS(links <= (bytes.size() - in.at) / 4, "malformed peer info: {} NVLinks in {} bytes", links, bytes.size() - in.at);
  for (std::uint32_t i = 0; i < links; ++i) info.nvlink_bus_ids.push_back(in.string("NVLink bus id"));
  info.nvswitch_links = in.u32("NVSwitch link count");
  info.cpu = static_cast<std::int32_t>(in.u32("CPU"));
  RINGFENCE_EXPECTS(info.cpu >= -1, "malformed peer info: CPU {}", info.cpu);
  RINGFENCE_EXPECTS(in.at == bytes.size(), "malformed peer info: {} trailing bytes", bytes.size() - in.at);
  return info;
}

const TransportTraits& Transport::traits() const noexcept {
  static const TransportTraits kNone;  // immutable: a transport that declares nothing
  return kNone;
}

}  // namespace ringfence
