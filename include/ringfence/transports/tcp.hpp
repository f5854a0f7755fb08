#pragma once
/// \file transports/tcp.hpp
/// TCP transport for ranks on different hosts (target `ringfence::transport_tcp`).
///
/// - Connections: the lower rank of a pair dials `Options::sockets` sockets to the higher
///   rank's listening socket (non-blocking connect, retried until the communicator's deadline);
///   every connection opens with a hello carrying a per-listener secret that travelled through
///   the (token-protected) bootstrap store, so connections from outside the job are refused and
///   logged. `TCP_NODELAY`, socket buffers of `Options::buffer_bytes`.
/// - Writes: a frame header {region, offset, length} and the payload, sent in the caller's
///   thread; writes of at least 2 x `Options::stripe_min_bytes` are cut into one part per socket. On the
///   receiving side, a thread waiting on the link reads its sockets itself; otherwise the
///   transport's progress thread (epoll over every socket) does. Either places each payload
///   straight at its offset in the registered region, after checking region, offset and length
///   against the registration: a malformed or truncated frame fences the link with a clear
///   error and never writes out of bounds.
/// - Signals: a frame carrying the value and how many write frames went out on each socket
///   before it; the receiver stores the value (release) only after those writes landed, so a
///   signal is ordered after every earlier write on the link, across sockets.
/// - Liveness: a closed or reset connection marks the link broken; waits on it return
///   `PeerUnreachable` within one wait slice.
/// Interface selection: `Options::interfaces` (RINGFENCE_SOCKET_IFNAME), NCCL_SOCKET_IFNAME
/// syntax: comma-separated name prefixes, `^` in front excludes them, `=` in front matches
/// names exactly. Default: the first up IPv4 interface that is not loopback, else loopback.
/// See transports/tcp/README.md.

#include <memory>
#include <optional>
#include <ringfence/transport.hpp>
#include <ringfence/transport_settings.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::transports::tcp {

/// Registry name of this transport.
inline constexpr std::string_view kName = "tcp";

/// This transport's settings, read from `CommOptions::transport_settings` (its variables:
/// `setting_keys()`).
struct Options {
  /// Sockets per link; writes of at least 2 x `stripe_min_bytes` are striped across them.
  /// RINGFENCE_TCP_SOCKETS (1..8).
  int sockets = 2;
  /// Smallest part of a striped write. RINGFENCE_TCP_STRIPE_MIN_BYTES.
  std::size_t stripe_min_bytes = 128 * 1024;
  /// Pipeline chunk the tcp transport asks for (`Reachability::min_chunk_bytes`), used instead of
  /// `CommOptions::chunk_bytes` when larger as soon as a link of the communicator is tcp: every
  /// chunk costs a signal round on the socket. Measured on loopback, 2 ranks, allreduce busbw,
  /// three alternating runs, once a waiting thread kept its link's sockets between waits
  /// (bench/README.md "tcp"): 512 KiB gave 3.2-3.5 GB/s at 4 MiB, 2.9-3.4 at 16 MiB and 2.7-3.6
  /// at 64 MiB, against 1.7-2.0, 1.75-1.9 and 1.45-2.0 with 1 MiB; 256 KiB fell between them;
  /// at 1 MiB all were within noise. RINGFENCE_TCP_CHUNK_BYTES.
  std::size_t chunk_bytes = 512 * 1024;
  /// SO_SNDBUF / SO_RCVBUF of every socket (the kernel may cap it). RINGFENCE_TCP_BUFFER_BYTES.
  std::size_t buffer_bytes = 4 * 1024 * 1024;
  /// Microseconds a waiter keeps reading its link's sockets without blocking (yielding the CPU
  /// between reads, so oversubscribed ranks still run) before it sleeps in `ppoll`, where every
  /// answer costs a wake-up. Loopback, 2 ranks, allreduce, three alternating runs: 50 took 8 B
  /// from 26-44 to 15-19 us and 32 KiB from 0.32-0.58 to 0.71-0.78 GB/s; 200 was no better;
  /// 4 ranks on 2 cores, best of two: 64 B-256 KiB 1.3-1.8x faster, 8 B even. RINGFENCE_TCP_SPIN_US (0 = sleep at
  /// once).
  int spin_us = 50;
  /// Interfaces to listen on, NCCL_SOCKET_IFNAME syntax ("eth", "^docker,lo", "=eth0"); empty =
  /// the first up non-loopback IPv4 interface, else loopback. RINGFENCE_SOCKET_IFNAME.
  std::string interfaces;
  /// The settings of `options` (null: the defaults). Throws `InvalidUsage` naming a variable
  /// with a bad value.
  static Options from(const CommOptions* options);
};

/// The variables this transport reads (register them with the transport: `TransportRegistry::add`).
std::span<const SettingKey> setting_keys() noexcept;

/// Creates the TCP transport for one communicator.
std::unique_ptr<Transport> make_transport(const TransportContext& context);

/// An interface filter in NCCL_SOCKET_IFNAME syntax (see the file comment).
struct InterfaceFilter {
  std::vector<std::string> names;  ///< prefixes (or exact names with `exact`)
  bool exclude = false;            ///< `^`: every interface except these
  bool exact = false;              ///< `=`: names match exactly
};

/// Parses `text` (e.g. "eth,ib", "^docker,lo", "=eth0"); empty text = no filter. Throws
/// `InvalidUsage` naming the text when a name is empty.
InterfaceFilter parse_interface_filter(std::string_view text);
/// True when interface `name` passes `filter`.
bool interface_matches(const InterfaceFilter& filter, std::string_view name) noexcept;

/// One IPv4 interface of this host.
struct Interface {
  std::string name;     ///< e.g. "eth0"
  std::string address;  ///< dotted quad
  bool loopback = false;
};
/// Picks the interface to listen on from `candidates` (in the host's order): the first that
/// passes `filter`; without a filter the first non-loopback one, else the first loopback one.
/// nullopt when none passes. Pure.
std::optional<Interface> choose_interface(const std::vector<Interface>& candidates, const InterfaceFilter& filter);
/// The host's up IPv4 interfaces (getifaddrs), in the kernel's order.
std::vector<Interface> host_interfaces();

}  // namespace ringfence::transports::tcp
