// TCP transport: construction, teardown and make_transport; the other parts are listed below.
//
// TCP transport. Control plane (listen, connect, registration) may block and throw; the Link
// data path is noexcept and allocation-free: a write sends a frame header and the payload from
// the caller's buffer (sendmsg, no copy on our side), a signal sends a small frame. One progress
// thread per transport (started with the first link) reads every socket with epoll and places
// payloads straight into registered memory, checking every length and offset first; a thread
// waiting on a link reads that link itself, and keeps it for a while (see wait_reading).
//
// Files: tcp_interfaces.cpp (interface choice), tcp_connect.cpp (listen, hello, dial/accept),
// tcp_regions.{hpp,cpp} (memory regions), tcp_link.{hpp,cpp} (the link's data path),
// tcp_transport.hpp (the transport; its receive path inline), tcp_progress.cpp (progress thread,
// lingering close), tcp_frame.hpp (wire format and parser, pure).
#include <chrono>
#include <memory>
#include <ringfence/error.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/tcp.hpp>

#include "tcp_transport.hpp"

namespace ringfence::transports::tcp {
namespace detail {

TcpTransport::TcpTransport(const TransportContext& ctx)
    : self_(ctx.self),
      options_(Options::from(ctx.options)),
      timeout_(ctx.options ? ctx.options->timeout : std::chrono::milliseconds(60000)),
      log_(ctx.log) {
  RINGFENCE_EXPECTS(options_.sockets >= 1 && options_.sockets <= kMaxSockets, "rank {}: RINGFENCE_TCP_SOCKETS must be in [1, {}] (got {})",
                    self_.rank, kMaxSockets, options_.sockets);
  filter_ = parse_interface_filter(options_.interfaces);
}
TcpTransport::~TcpTransport() {
  stop();
  close_lingering();
}

}  // namespace detail

namespace {
constexpr SettingKey kSettings[] = {
    {"RINGFENCE_TCP_SOCKETS", "sockets per link (1..8); large writes are striped across them"},
    {"RINGFENCE_TCP_STRIPE_MIN_BYTES", "smallest part of a striped write"},
    {"RINGFENCE_TCP_CHUNK_BYTES", "pipeline chunk once a link is tcp (if larger than RINGFENCE_CHUNK_BYTES)"},
    {"RINGFENCE_TCP_BUFFER_BYTES", "SO_SNDBUF / SO_RCVBUF of every socket"},
    {"RINGFENCE_TCP_SPIN_US", "microseconds a waiter reads its sockets without blocking before it sleeps (>= 0)"},
    {"RINGFENCE_SOCKET_IFNAME", "interfaces to listen on (NCCL_SOCKET_IFNAME syntax)"},
};
}  // namespace

std::span<const SettingKey> setting_keys() noexcept { return kSettings; }

Options Options::from(const CommOptions* options) {
  const SettingsReader r(options);
  Options o;
  o.sockets = static_cast<int>(r.integer("RINGFENCE_TCP_SOCKETS", o.sockets, 1, 8));
  o.stripe_min_bytes = r.bytes("RINGFENCE_TCP_STRIPE_MIN_BYTES", o.stripe_min_bytes);
  o.chunk_bytes = r.bytes("RINGFENCE_TCP_CHUNK_BYTES", o.chunk_bytes);
  o.buffer_bytes = r.bytes("RINGFENCE_TCP_BUFFER_BYTES", o.buffer_bytes);
  o.interfaces = r.text("RINGFENCE_SOCKET_IFNAME").value_or(o.interfaces);
  o.spin_us = static_cast<int>(r.integer("RINGFENCE_TCP_SPIN_US", o.spin_us, 0, 1000000));
  return o;
}

std::unique_ptr<Transport> make_transport(const TransportContext& context) { return std::make_unique<detail::TcpTransport>(context); }

}  // namespace ringfence::transports::tcp
