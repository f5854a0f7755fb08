#include "failure.hpp"

#include <fmt/format.h>

#include <ringfence/error.hpp>

#include "context.hpp"
#include "lanes.hpp"

namespace ringfence::detail {

bool CommFailure::record(Status s, const std::string& why) noexcept {
  std::lock_guard lock(mutex_);
  if (!status_.is_ok()) return false;
  try {
    why_ = why;
  } catch (...) {
  }
  status_ = s;
  failed_.store(true, std::memory_order_release);
  return true;
}

Status CommFailure::status() const noexcept {
  std::lock_guard lock(mutex_);
  return status_;
}

std::pair<Status, std::string> CommFailure::get() const {
  std::lock_guard lock(mutex_);
  return {status_, why_};
}

void CommFailure::throw_if_failed(const char* call) const {
  if (!failed()) return;
  std::lock_guard lock(mutex_);
  if (!status_.is_ok())
    throw_status(status_, fmt::format("rank {}: {} on a communicator that already failed: {}", ctx_.rank, call, why_));
}

void CommFailure::local_abort(ErrorCode code, int blamed) noexcept {
  lanes_.local_abort(FlagBlock::abort_value(code, ctx_.rank, blamed));
}

void CommFailure::abort_peers(ErrorCode code, int blamed) noexcept {
  lanes_.abort_peers(FlagBlock::abort_value(code, ctx_.rank, blamed));
}

void CommFailure::forward_abort(ErrorCode code, int origin, int blamed) noexcept {
  lanes_.abort_peers(FlagBlock::abort_value(code, origin, blamed), origin);
}

void CommFailure::fail(Status s, const std::string& why, int blamed) noexcept {
  record(s, why);
  local_abort(s.code(), blamed);
  abort_peers(s.code(), blamed);
}

std::string class_of(ErrorCode code) {
  // Transient is what the engine's checksums and a transport's exhausted retries (ibverbs
  // retry-exceeded) both end in: say what it means without naming one cause.
  if (code == ErrorCode::Transient) return "transient: a link kept failing (checksums or retries exhausted)";
  return std::string(to_string(code));
}

void set_local_abort(LaneState& lane, std::uint32_t value) noexcept {
  if (!lane.flags.abort) return;
  std::uint32_t expected = 0;
  lane.flags.abort->value.compare_exchange_strong(expected, value, std::memory_order_acq_rel);
}

void signal_abort(LaneState& lane, int size, std::uint32_t value, int skip) noexcept {
  for (auto& ch : lane.connections) {
    if (!ch->link || !ch->peer_flags || ch->peer == skip) continue;
    (void)ch->link->signal(SignalOp{&ch->peer_flags, FlagBlock::abort_offset(size), value, 0});
    poll_link(*ch);
  }
}

FailureReport describe_failure(int rank, const char* call, std::uint64_t seq, const Failure& f, const std::string* link_transport,
                               std::chrono::nanoseconds timeout, const std::string& silent_note) {
  const std::string link =
      link_transport ? fmt::format("{} link rank {} <-> rank {}", *link_transport, rank, f.peer) : std::string("local");
  std::string why;
  if (f.aborted_by_peer) {
    why = f.status.code() == ErrorCode::Aborted ? fmt::format("rank {} aborted the communicator (abort())", f.peer)
          : f.blamed >= 0 ? fmt::format("rank {} failed ({}, blaming rank {}) and aborted the collective", f.peer,
                                        class_of(f.status.code()), f.blamed)
                          : fmt::format("rank {} failed ({}) and aborted the collective", f.peer, class_of(f.status.code()));
  } else {
    switch (f.status.code()) {
      case ErrorCode::Timeout:
        why = fmt::format("timed out after {} ms waiting for {} from rank {}{}", timeout / std::chrono::milliseconds(1), f.what,
                          f.peer, silent_note);
        break;
      case ErrorCode::PeerUnreachable:
        why = fmt::format("rank {} is unreachable (process exited?) while waiting for {}", f.peer, f.what);
        break;
      case ErrorCode::Fenced: why = fmt::format("the link to rank {} is fenced ({})", f.peer, f.what); break;
      default: why = fmt::format("{} while {} (native code {})", to_string(f.status.code()), f.what, f.status.native()); break;
    }
  }
  FailureReport r;
  r.message = fmt::format("rank {}: {} #{} failed: {} ({}, message {})", rank, call, seq, why, link, f.message);
  r.status = f.aborted_by_peer && f.status.code() == ErrorCode::Aborted ? Status(ErrorCode::PeerUnreachable) : f.status;
  return r;
}

}  // namespace ringfence::detail
