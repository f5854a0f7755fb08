#pragma once
// Internal to the ibverbs transport (and its unit tests): the pure parts, kept apart from the
// code that talks to a device so that every one of them is tested on a machine without an HCA.
//   - the connection blob exchanged through the bootstrap store and the region key, each with a
//     serialise/parse pair that refuses garbage;
//   - bounds checks of remote writes;
//   - ibv_qp_attr + attribute mask for RESET->INIT, INIT->RTR and RTR->RTS;
//   - classification of completion statuses and asynchronous events for the health layer;
//   - the port's signalling rate.
// The verbs header is included only here, in ibverbs_device.hpp and in the transport's own files
// (never under include/).
#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <ringfence/status.hpp>
#include <ringfence/transport.hpp>
#include <span>
#include <string_view>
#include <vector>

namespace ringfence::transports::ibverbs::detail {

/// What a rank publishes from `listen()`: its port and one RC queue pair per possible peer
/// (`qpns[r]` is the queue pair meant for rank r; the entry for the rank itself is unused).
struct ConnInfo {
  std::uint32_t rank = 0;                 ///< the publishing rank
  std::uint16_t lid = 0;                  ///< port LID (0 on RoCE)
  std::uint8_t port = 1;                  ///< port number, 1-based
  std::uint8_t mtu = IBV_MTU_1024;        ///< active MTU as `ibv_mtu` (1..5)
  std::uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;  ///< IBV_LINK_LAYER_*
  std::array<std::uint8_t, 16> gid{};     ///< GID at the configured index (raw bytes)
  std::uint32_t psn = 0;                  ///< first packet sequence number (24 bits)
  std::vector<std::uint32_t> qpns;        ///< queue pair numbers (24 bits) by peer rank
  friend bool operator==(const ConnInfo&, const ConnInfo&) = default;
};

/// Largest rank count a connection blob may describe (bounds the parser's allocation).
inline constexpr std::uint32_t kMaxRanks = 1u << 20;

/// Bytes for the bootstrap store: "RFIB", version, fixed fields, count, qpns (little-endian).
Bytes serialize(const ConnInfo& info);
/// Parses `serialize(ConnInfo)` output. Throws `InvalidUsage` (saying what is wrong) on a bad
/// magic or version, a length that does not match the count exactly (truncated or oversize),
/// a count above kMaxRanks, an MTU outside 1..5, port 0, or a PSN/QPN above 24 bits.
ConnInfo parse_conn_info(std::span<const std::byte> bytes);

/// What a peer needs to write into a registered region.
struct RegionKey {
  std::uint64_t addr = 0;    ///< virtual address of the first byte
  std::uint64_t length = 0;  ///< length in bytes
  std::uint32_t rkey = 0;    ///< remote key
  friend bool operator==(const RegionKey&, const RegionKey&) = default;
};
/// Bytes of a region key: "RFIK", version, addr, length, rkey (little-endian, 26 bytes).
Bytes serialize(const RegionKey& key);
/// Parses `serialize(RegionKey)` output. Throws `InvalidUsage` on a wrong length, bad magic or
/// version, or a region whose end wraps around the address space.
RegionKey parse_region_key(std::span<const std::byte> bytes);

/// True when [offset, offset + bytes) lies inside a region of `size` bytes (overflow-safe).
constexpr bool range_ok(std::size_t offset, std::size_t bytes, std::size_t size) noexcept {
  return offset <= size && bytes <= size - offset;
}

/// Queue pair settings that do not come from the peer.
struct QpParams {
  std::uint8_t port = 1;           ///< local port number
  std::uint16_t pkey_index = 0;    ///< partition key index
  unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;  ///< remote access allowed
  std::uint8_t timeout = 20;       ///< local ACK timeout exponent
  std::uint8_t retry_count = 7;    ///< transport retries
  std::uint8_t rnr_retry = 7;      ///< RNR retries (7 = infinite)
  std::uint8_t min_rnr_timer = 12; ///< RNR NAK timer code (NCCL's value)
  std::uint8_t service_level = 0;  ///< SL
  std::uint8_t traffic_class = 0;  ///< GRH traffic class
  std::uint8_t gid_index = 0;      ///< local GID index (source GID)
  std::uint8_t max_rd_atomic = 1;  ///< outstanding RDMA reads/atomics (none are used; 1 as NCCL)
  std::uint8_t local_mtu = IBV_MTU_1024;  ///< local active MTU
  std::uint8_t local_link_layer = IBV_LINK_LAYER_INFINIBAND;  ///< local port's link layer
};

/// Attributes and mask for one `ibv_modify_qp` call.
struct QpTransition {
  ibv_qp_attr attr{};  ///< zeroed except for the fields named in `mask`
  int mask = 0;        ///< IBV_QP_* bits
};
/// RESET -> INIT: state, pkey index, port, access flags.
QpTransition init_transition(const QpParams& p) noexcept;
/// INIT -> RTR towards queue pair `remote_qpn` of `remote`: path MTU = min of both ends,
/// destination QPN, the remote PSN, max_dest_rd_atomic, min_rnr_timer and the address vector
/// (a GRH with the remote GID when either end is Ethernet/RoCE or the remote LID is 0).
QpTransition rtr_transition(const QpParams& p, const ConnInfo& remote, std::uint32_t remote_qpn) noexcept;
/// RTR -> RTS with our own PSN: timeout, retry count, RNR retry, SQ PSN, max_rd_atomic.
QpTransition rts_transition(const QpParams& p, std::uint32_t local_psn) noexcept;

/// What a link does with one completion.
enum class WcAction : std::uint8_t {
  Complete,   ///< success
  LinkError,  ///< the path failed (no ACK, receiver not ready): counted; the health layer decides
  Fence,      ///< a protection, access or local error, or a flush: the link is fenced at once
};
/// Classification of an `ibv_wc_status`.
struct WcClass {
  WcAction action = WcAction::Complete;  ///< what the link does
  ErrorCode code = ErrorCode::Ok;        ///< status of the completion (native = the wc status)
  bool timeout = false;                  ///< also counted in LinkStats::timeouts
};
/// RETRY_EXC_ERR, RNR_RETRY_EXC_ERR, RESP_TIMEOUT_ERR: LinkError, Transient, timeout.
/// WR_FLUSH_ERR: Fence, Fenced (the queue pair was already in the error state). Every other
/// error, and unknown values: Fence, Ibv. Pure.
WcClass classify_wc_status(int status) noexcept;
/// Short name of a completion status ("retry-exceeded", ...). Pure.
std::string_view wc_status_name(int status) noexcept;

/// What the transport does with one asynchronous event.
enum class AsyncAction : std::uint8_t {
  Ignore,       ///< nothing (COMM_EST)
  Log,          ///< informational: logged, nothing else
  PortDown,     ///< the port left ACTIVE: every link on it reports a link error (PeerUnreachable)
  PortUp,       ///< the port is ACTIVE again: logged; links stay as the health layer left them
  FenceQp,      ///< one queue pair (or its CQ) is unusable: that link is fenced
  FenceDevice,  ///< the device is unusable: every link is fenced
};
/// Classification of an `ibv_event_type`.
struct AsyncClass {
  AsyncAction action = AsyncAction::Log;  ///< what to do
  std::string_view name;                  ///< event name for logs ("port-error", ...)
};
/// QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR, WQ_FATAL: FenceQp. DEVICE_FATAL: FenceDevice.
/// PORT_ERR: PortDown. PORT_ACTIVE: PortUp. COMM_EST: Ignore. Everything else (LID, PKEY, SM,
/// GID change, path migration, SRQ events, client re-register, speed change, unknown): Log.
/// Pure.
AsyncClass classify_async_event(int event_type) noexcept;

/// Signalling rate of a port in GB/s (1e9 bytes/s, data after encoding overhead ignored) from
/// `ibv_port_attr::active_width` and `active_speed`; 0 when either code is unknown. Pure.
double port_gbps(std::uint8_t active_width, std::uint32_t active_speed) noexcept;

}  // namespace ringfence::transports::ibverbs::detail
