#pragma once
/// \file status.hpp
/// `ErrorCode` and the trivially copyable `Status` returned by the data path, the transport
/// SPI and the progress loop. Nothing that returns a `Status` throws or allocates.

#include <cstdint>
#include <ringfence/config.hpp>
#include <string_view>

namespace ringfence {

/// Classification of every failure in ringfence. Transports map their native codes
/// (errno, cudaError_t, ibv_wc_status) onto these; the raw code travels in `Status::native()`.
enum class ErrorCode : std::uint8_t {
  Ok = 0,           ///< success
  InProgress,       ///< not finished yet; poll again (non-blocking calls only)
  InvalidUsage,     ///< caller error: bad argument, mismatched call, use after error
  System,           ///< an OS call failed (errno in `native()`)
  Cuda,             ///< a CUDA runtime/driver call failed (cudaError_t in `native()`)
  Ibv,              ///< a verbs call failed (errno or ibv_wc_status in `native()`)
  Transient,        ///< a retryable link error (checksum mismatch, retry exceeded)
  Timeout,          ///< a deadline passed while waiting for a peer
  PeerUnreachable,  ///< the peer is gone (process exited, connection closed)
  Fenced,           ///< the link was fenced; pending work was cancelled
  Aborted,          ///< `Communicator::abort()` ended the work on this rank
  Fatal,            ///< unrecoverable internal failure
};

/// Short, stable lower-case name of an error code ("timeout", "peer-unreachable", ...).
/// Thread-safe, never allocates.
constexpr std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::Ok: return "ok";
    case ErrorCode::InProgress: return "in-progress";
    case ErrorCode::InvalidUsage: return "invalid-usage";
    case ErrorCode::System: return "system";
    case ErrorCode::Cuda: return "cuda";
    case ErrorCode::Ibv: return "ibv";
    case ErrorCode::Transient: return "transient";
    case ErrorCode::Timeout: return "timeout";
    case ErrorCode::PeerUnreachable: return "peer-unreachable";
    case ErrorCode::Fenced: return "fenced";
    case ErrorCode::Aborted: return "aborted";
    case ErrorCode::Fatal: return "fatal";
  }
  return "unknown";
}

/// Result of a data-path or SPI operation: an error code plus the native code it came from.
/// Trivially copyable, 8 bytes; `[[nodiscard]]` so errors cannot be dropped silently.
class [[nodiscard]] Status {
 public:
  /// Success.
  constexpr Status() noexcept = default;
  /// A status with `code` and an optional native code (errno, cudaError_t, ibv_wc_status).
  constexpr Status(ErrorCode code, std::int32_t native = 0) noexcept : code_(code), native_(native) {}

  /// The success value.
  static constexpr Status ok() noexcept { return {}; }

  /// True for `ErrorCode::Ok`.
  constexpr bool is_ok() const noexcept { return code_ == ErrorCode::Ok; }
  /// True for `ErrorCode::InProgress`.
  constexpr bool in_progress() const noexcept { return code_ == ErrorCode::InProgress; }
  /// True for anything but Ok and InProgress.
  constexpr bool is_error() const noexcept { return !is_ok() && !in_progress(); }
  /// The classified code.
  constexpr ErrorCode code() const noexcept { return code_; }
  /// The native code the transport saw (0 when none).
  constexpr std::int32_t native() const noexcept { return native_; }

  friend constexpr bool operator==(Status a, Status b) noexcept = default;

 private:
  ErrorCode code_ = ErrorCode::Ok;
  std::int32_t native_ = 0;
};

}  // namespace ringfence

/// Returns early from the enclosing function when `expr` yields a non-Ok `Status`
/// (NCCL's NCCLCHECK without goto). Usable in noexcept code.
#define RINGFENCE_TRY(expr)                          \
  do {                                               \
    ::ringfence::Status rf_try_status_ = (expr);     \
    if (RINGFENCE_UNLIKELY(!rf_try_status_.is_ok())) \
      return rf_try_status_;                         \
  } while (0)
