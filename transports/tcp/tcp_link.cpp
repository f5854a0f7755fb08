// The tcp link's wait (the calling thread reads the link itself: TcpTransport::wait_reading) and
// its close (the transport stops reading it and lingers on its sockets).
#include <ringfence/transport_util.hpp>

#include "tcp_transport.hpp"

namespace ringfence::transports::tcp::detail {

Status TcpLink::wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept {
  RINGFENCE_TRY(flush());
  if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
  if (state_ == LinkState::Fenced) return Status(ErrorCode::Fenced);
  if (const Status b = broken(); !b.is_ok()) return b;
  return transport_.wait_reading(*this, flag, target, max);
}

TcpLink::~TcpLink() {
  (void)flush();
  transport_.remove_link(this);
  transport_.linger(fds_, abandon_, same_process_);
}

}  // namespace ringfence::transports::tcp::detail
