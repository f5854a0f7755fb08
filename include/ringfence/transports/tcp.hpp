#pragma once
/// \file transports/tcp.hpp
/// TCP transport for ranks on different hosts (target `ringfence::transport_tcp`).
///
/// - Connections: the lower rank of a pair dials `TcpOptions::sockets` sockets to the higher
///   rank's listening socket (non-blocking connect, retried until the communicator's deadline);
///   every connection opens with a hello carrying a per-listener secret that travelled through
///   the (token-protected) bootstrap store, so connections from outside the job are refused and
///   logged. `TCP_NODELAY`, socket buffers of `TcpOptions::buffer_bytes`.
/// - Writes: a frame header {region, offset, length} and the payload, sent in the caller's
///   thread; writes of at least 2 x `TcpOptions::stripe_min_bytes` are cut into one part per socket. On the
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
/// Interface selection: `TcpOptions::interfaces` (RINGFENCE_SOCKET_IFNAME), NCCL_SOCKET_IFNAME
/// syntax: comma-separated name prefixes, `^` in front excludes them, `=` in front matches
/// names exactly. Default: the first up IPv4 interface that is not loopback, else loopback.
/// See transports/tcp/README.md.

#include <memory>
#include <optional>
#include <ringfence/transport.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::transports::tcp {

/// Registry name of this transport.
inline constexpr std::string_view kName = "tcp";

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
