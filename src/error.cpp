#include <cstring>
#include <ringfence/error.hpp>

namespace ringfence {

void throw_status(Status status, const std::string& message) {
  switch (status.code()) {
    case ErrorCode::Ok:
    case ErrorCode::InProgress: throw Error(ErrorCode::Fatal, "internal error: throw_status(ok): " + message);
    case ErrorCode::InvalidUsage: throw InvalidUsage(message);
    case ErrorCode::System: throw SystemError(message, status.native());
    case ErrorCode::Cuda: throw CudaError(message, status.native());
    case ErrorCode::Ibv: throw IbvError(message, status.native());
    case ErrorCode::Timeout: throw TimeoutError(message);
    case ErrorCode::PeerUnreachable: throw PeerUnreachableError(message);
    case ErrorCode::Fenced: throw LinkFencedError(message, -1, -1);
    case ErrorCode::Aborted: throw AbortedError(message);
    case ErrorCode::Transient:
    case ErrorCode::Fatal: break;
  }
  throw Error(status.code(), message, status.native());
}

namespace detail {
void throw_system_error(const char* expr, const char* file, int line, int err) {
  throw SystemError(fmt::format("{} failed: {} ({}:{})", expr, std::strerror(err), file, line), err);
}
void throw_invalid_usage(const char* file, int line, const std::string& message) {
  (void)file;
  (void)line;
  throw InvalidUsage(message);
}
}  // namespace detail

}  // namespace ringfence
