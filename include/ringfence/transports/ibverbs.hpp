#pragma once
/// \file transports/ibverbs.hpp
/// InfiniBand / RoCE verbs transport for ranks on hosts with HCAs (target
/// `ringfence::transport_ibverbs`, built when the libibverbs headers are found).
///
/// - Queue pairs: one RC queue pair per link. `listen()` creates one queue pair per possible
///   peer and publishes their numbers with the port's LID, GID, MTU and a random PSN; `connect`
///   takes the peer's queue pair for this rank and moves its own through INIT, RTR and RTS.
/// - Writes: `IBV_WR_RDMA_WRITE` from the source region's registration, or, for a source not
///   registered with this transport, from a per-link registered bounce buffer it is copied into.
///   Offset and length are checked against the imported region before anything is posted.
/// - Signals: `IBV_WR_RDMA_WRITE_WITH_IMM` of the 4-byte value into the flag (inline): on an RC
///   queue pair it executes after every earlier write on the link.
/// - Memory: host memory through `ibv_reg_mr`; device memory (GPUDirect RDMA) through dma-buf
///   (`cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`, transports/ibverbs/dmabuf.hpp).
/// - Errors: completion statuses and asynchronous events are classified (see
///   transports/ibverbs/ibverbs_detail.hpp): retry-exceeded errors are link errors counted for
///   the health layer, protection/access/flush errors fence the link.
/// - No HCA, or no libibverbs.so.1 at run time (the library is dlopen'ed): the transport is
///   created anyway and reports every peer unreachable, with the reason.
/// Device and port selection: `Options::hca` (RINGFENCE_IB_HCA), NCCL_IB_HCA syntax.
/// Not in `builtin_transports()` yet: add it explicitly (see transports/ibverbs/README.md).

#include <ringfence/build_config.hpp>

#if !RINGFENCE_HAS_IBVERBS
#error "ringfence was built without the ibverbs transport (RINGFENCE_WITH_IBVERBS, libibverbs headers not found)"
#endif

#include <memory>
#include <optional>
#include <ringfence/transport.hpp>
#include <ringfence/transport_settings.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::transports::ibverbs {

/// Registry name of this transport.
inline constexpr std::string_view kName = "ibverbs";

/// This transport's settings, read from `CommOptions::transport_settings` (its variables:
/// `setting_keys()`); see transports/ibverbs/README.md.
struct Options {
  /// Devices and ports to use, NCCL_IB_HCA syntax: comma list of `name[:port]` prefixes
  /// ("mlx5_0:1,mlx5_1"), `^` in front excludes them, `=` in front matches names exactly
  /// (`^=mlx5_2` also works). Empty = every device; the first ACTIVE port that passes is used.
  /// Parsed by `parse_hca_filter` when the transport is created. RINGFENCE_IB_HCA.
  std::string hca;
  /// GID table index for RoCE (and for routed IB). RINGFENCE_IB_GID_INDEX (0..255).
  int gid_index = 0;
  /// Local ACK timeout exponent: 4.096 us x 2^timeout per try (20 = ~4.3 s, NCCL's default).
  /// RINGFENCE_IB_TIMEOUT (1..31).
  int timeout = 20;
  /// Transport retries before a write completes with RETRY_EXC_ERR. RINGFENCE_IB_RETRY_CNT (0..7).
  int retry_count = 7;
  /// Service level of the queue pairs. RINGFENCE_IB_SL (0..15).
  int service_level = 0;
  /// Traffic class (RoCE DSCP << 2) of the queue pairs. RINGFENCE_IB_TC (0..255).
  int traffic_class = 0;
  /// Registered bounce buffer per link for writes whose source is not registered with this
  /// transport (the engine's staging slots): such writes are copied into it (bytes).
  /// RINGFENCE_IB_STAGING_BYTES.
  std::size_t staging_bytes = 4 * 1024 * 1024;
  /// Library to dlopen (tests and unusual installs only). RINGFENCE_IB_LIBRARY.
  std::string library = "libibverbs.so.1";
  /// The settings of `options` (null: the defaults). Throws `InvalidUsage` naming a variable
  /// with a bad value.
  static Options from(const CommOptions* options);
};

/// The variables this transport reads (register them with the transport: `TransportRegistry::add`).
std::span<const SettingKey> setting_keys() noexcept;

/// Creates the verbs transport for one communicator (settings: `Options::from(context.options)`).
/// Never fails for want of hardware: without a usable HCA port the transport reaches nobody
/// and `can_reach` says why. Throws `InvalidUsage` for a malformed `Options::hca`.
/// Blocking: opens the device (milliseconds).
std::unique_ptr<Transport> make_transport(const TransportContext& context);

/// One entry of an HCA filter: a device name (prefix unless the filter is exact) and an
/// optional port number.
struct HcaEntry {
  std::string name;  ///< device name or prefix, e.g. "mlx5_0" or "mlx5"
  int port = -1;     ///< port number (1-based), -1 = every port
  friend bool operator==(const HcaEntry&, const HcaEntry&) = default;
};

/// A device filter in NCCL_IB_HCA syntax: `mlx5_0:1,mlx5_1` (prefixes, optional ports),
/// `^mlx5_2` (every device except these), `=mlx5_0` (exact names), `^=mlx5_0` (both).
struct HcaFilter {
  std::vector<HcaEntry> entries;  ///< empty = every device and port
  bool exclude = false;           ///< `^`: everything except the entries
  bool exact = false;             ///< `=`: names match exactly, not as prefixes
};

/// Parses `text` (see `HcaFilter`); empty text = no filter. Throws `InvalidUsage` naming
/// RINGFENCE_IB_HCA and the text when an entry has an empty name or a port that is not a
/// number in [1, 255]. Pure.
HcaFilter parse_hca_filter(std::string_view text);
/// True when port `port` of device `device` passes `filter`. Pure, noexcept.
bool hca_matches(const HcaFilter& filter, std::string_view device, int port) noexcept;

/// One port of one device as found on the host.
struct HcaPort {
  std::string device;   ///< device name, e.g. "mlx5_0"
  int port = 1;         ///< 1-based port number
  bool active = false;  ///< port state is IBV_PORT_ACTIVE
};
/// The port to use: the first active one (in the host's order) that passes `filter`; nullopt
/// when none does. Pure.
std::optional<HcaPort> choose_port(const std::vector<HcaPort>& ports, const HcaFilter& filter);

}  // namespace ringfence::transports::ibverbs
