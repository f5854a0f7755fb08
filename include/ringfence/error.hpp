#pragma once
/// \file error.hpp
/// Exceptions thrown by the control plane (setup, communicator API). The data path never
/// throws; it returns `Status`, and the API boundary turns a failed `Status` into one of these.

#include <fmt/format.h>

#include <ringfence/status.hpp>
#include <stdexcept>
#include <string>

namespace ringfence {

/// Base of every ringfence exception. `code()` classifies it; `what()` is a complete,
/// human-readable sentence naming the rank, peer or argument involved.
class Error : public std::runtime_error {
 public:
  /// Builds an error with a classification and a message. The message is copied.
  Error(ErrorCode code, const std::string& message, std::int32_t native = 0)
      : std::runtime_error(message), code_(code), native_(native) {}
  /// The classification.
  ErrorCode code() const noexcept { return code_; }
  /// The native code (errno, cudaError_t, ibv status) or 0.
  std::int32_t native() const noexcept { return native_; }

 private:
  ErrorCode code_;
  std::int32_t native_;
};

/// The caller broke a precondition (bad argument, mismatched call, bad environment value).
class InvalidUsage : public Error {
 public:
  /// `message` should name the argument (or variable) and the rank.
  explicit InvalidUsage(const std::string& message) : Error(ErrorCode::InvalidUsage, message) {}
};

/// An operating-system call failed; `native()` holds errno.
class SystemError : public Error {
 public:
  /// `message` names the call; `err` is the errno value.
  SystemError(const std::string& message, int err) : Error(ErrorCode::System, message, err) {}
};

/// A CUDA call failed; `native()` holds the cudaError_t value.
class CudaError : public Error {
 public:
  /// `message` names the call; `err` is the cudaError_t value.
  CudaError(const std::string& message, int err) : Error(ErrorCode::Cuda, message, err) {}
};

/// A verbs call failed; `native()` holds errno or the ibv_wc_status.
class IbvError : public Error {
 public:
  /// `message` names the call; `err` is errno or ibv_wc_status.
  IbvError(const std::string& message, int err) : Error(ErrorCode::Ibv, message, err) {}
};

/// A deadline passed while waiting for a peer or the store.
class TimeoutError : public Error {
 public:
  /// `message` names what was awaited, from which rank, and the timeout.
  explicit TimeoutError(const std::string& message) : Error(ErrorCode::Timeout, message) {}
};

/// A peer is gone (exited, closed its connection).
class PeerUnreachableError : public Error {
 public:
  /// `message` names the peer rank and the link.
  explicit PeerUnreachableError(const std::string& message) : Error(ErrorCode::PeerUnreachable, message) {}
};

/// A link used by the call was fenced by the health layer.
class LinkFencedError : public Error {
 public:
  /// `rank` is the local rank, `peer` the other end of the fenced link.
  LinkFencedError(const std::string& message, int rank, int peer)
      : Error(ErrorCode::Fenced, message), rank_(rank), peer_(peer) {}
  /// Local rank that saw the fence.
  int rank() const noexcept { return rank_; }
  /// Peer rank at the other end of the fenced link.
  int peer() const noexcept { return peer_; }

 private:
  int rank_;
  int peer_;
};

/// `Communicator::abort()` was called on this rank: in-flight and later calls end with this.
class AbortedError : public Error {
 public:
  /// `message` names the rank and the call that was ended.
  explicit AbortedError(const std::string& message) : Error(ErrorCode::Aborted, message) {}
};

/// Throws the exception subclass matching `status.code()` with `message`. Does nothing for Ok.
/// Used at the API boundary to turn data-path failures into exceptions.
[[noreturn]] void throw_status(Status status, const std::string& message);

namespace detail {
[[noreturn]] void throw_system_error(const char* expr, const char* file, int line, int err);
[[noreturn]] void throw_invalid_usage(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace ringfence

/// Setup-code check of a POSIX call that returns -1 and sets errno; throws `SystemError`
/// naming the expression and location.
#define RINGFENCE_CHECK_SYS(expr)                                                   \
  do {                                                                             \
    if (RINGFENCE_UNLIKELY((expr) == -1))                                          \
      ::ringfence::detail::throw_system_error(#expr, __FILE__, __LINE__, errno);  \
  } while (0)

/// Throws `InvalidUsage` with a fmt-formatted message when `cond` is false.
#define RINGFENCE_EXPECTS(cond, ...)                                                                 \
  do {                                                                                              \
    if (RINGFENCE_UNLIKELY(!(cond)))                                                                \
      ::ringfence::detail::throw_invalid_usage(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__));    \
  } while (0)
