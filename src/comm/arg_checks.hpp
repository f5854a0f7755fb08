#pragma once
// Argument checks of every call, pure: they read nothing but their arguments and the
// communicator's rank and size, and return the bytes the call moves or throw `InvalidUsage`
// naming the call, the argument and the rank. Run on the caller's thread before anything is
// queued, shared by the host calls, the stream-ordered ones and the NCCL shim (`checked_bytes`).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ringfence/types.hpp>

namespace ringfence::detail {

/// Bytes of `count` elements of `type` times `blocks`, or nullopt when that overflows the
/// address space (more than PTRDIFF_MAX) or `type` is invalid. Inline, without a division: every
/// call checks it (ArgChecks::allreduce's one test among them).
inline std::optional<std::size_t> checked_bytes(std::size_t count, DataType type, std::size_t blocks = 1) noexcept {
  const std::size_t elem = size_of(type);  // 0 for an invalid type
  std::size_t bytes = 0;
  if (elem == 0 || __builtin_mul_overflow(count, elem, &bytes) || __builtin_mul_overflow(bytes, blocks, &bytes) ||
      bytes > static_cast<std::size_t>(PTRDIFF_MAX))
    return std::nullopt;
  return bytes;
}

/// True when [a, a + a_bytes) and [b, b + b_bytes) share no byte.
inline bool disjoint(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x + a_bytes <= y || y + b_bytes <= x;
}

/// The bytes a call reads from its send buffer (`in`) and writes to its receive buffer (`out`).
struct IoBytes {
  std::size_t in = 0;
  std::size_t out = 0;
};

/// The checks of one rank of a communicator of `size` ranks.
class ArgChecks {
 public:
  ArgChecks(int rank, int size) noexcept : rank_(rank), size_(size) {}

  IoBytes allreduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op) const;
  IoBytes reduce_scatter(const char* call, const void* send, const void* recv, std::size_t recvcount, DataType type,
                         ReduceOp op) const;
  IoBytes allgather(const char* call, const void* send, const void* recv, std::size_t sendcount, DataType type) const;
  /// `send` is read on the root only.
  IoBytes broadcast(const char* call, const void* send, const void* recv, std::size_t count, DataType type, int root) const;
  /// `recv` is written on the root only.
  IoBytes reduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                 int root) const;
  IoBytes alltoall(const char* call, const void* send, const void* recv, std::size_t count, DataType type) const;
  /// One send or receive of `count` elements with `peer`: the bytes it moves.
  std::size_t p2p(const char* call, const void* buf, std::size_t count, DataType type, int peer) const;

  void type(const char* call, DataType type) const;
  void op(const char* call, ReduceOp op) const;
  void root(const char* call, int root) const;
  void peer(const char* call, int peer) const;
  /// Bytes of `count` elements times `blocks`, refusing overflow (`what` names the count).
  std::size_t bytes_of(const char* call, const char* what, std::size_t count, DataType type, std::size_t blocks = 1) const;
  /// Null with bytes to move is refused.
  void pointer(const char* call, const char* what, const void* p, std::size_t bytes) const;

 private:
  // sendbuff and recvbuff may overlap only in the call's in-place form (`in_place`; `form`
  // describes it for the error, with the address `at` it asks for; null: the call has none).
  void overlap(const char* call, const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes,
               bool in_place, const char* form, const void* at) const;
  // The block collectives: one buffer holds a block per rank (reduce_scatter's send,
  // allgather's recv), the other one block.
  IoBytes blocks(const char* call, const char* count_name, std::size_t count, DataType type, const void* send,
                 const void* recv, bool send_is_whole) const;

  int rank_;
  int size_;
};

}  // namespace ringfence::detail
