#include "arg_checks.hpp"

#include <cstdint>
#include <ringfence/error.hpp>

namespace ringfence::detail {

void ArgChecks::type(const char* call, DataType type) const {
  RINGFENCE_EXPECTS(is_valid(type), "rank {}: {}: invalid datatype value {}", rank_, call, static_cast<int>(type));
}

void ArgChecks::op(const char* call, ReduceOp op) const {
  RINGFENCE_EXPECTS(is_valid(op), "rank {}: {}: invalid reduce op value {}", rank_, call, static_cast<int>(op));
}

void ArgChecks::root(const char* call, int root) const {
  RINGFENCE_EXPECTS(root >= 0 && root < size_, "rank {}: {}: root {} is out of range [0, {})", rank_, call, root, size_);
}

void ArgChecks::peer(const char* call, int peer) const {
  RINGFENCE_EXPECTS(peer >= 0 && peer < size_, "rank {}: {}: peer {} is out of range [0, {})", rank_, call, peer, size_);
}

std::size_t ArgChecks::bytes_of(const char* call, const char* what, std::size_t count, DataType type, std::size_t blocks) const {
  const std::optional<std::size_t> bytes = checked_bytes(count, type, blocks);
  RINGFENCE_EXPECTS(bytes.has_value(), "rank {}: {}: {} {} of {} (x {} blocks) overflows the address space", rank_, call, what,
                    count, to_string(type), blocks);
  return *bytes;
}

void ArgChecks::pointer(const char* call, const char* what, const void* p, std::size_t bytes) const {
  RINGFENCE_EXPECTS(bytes == 0 || p != nullptr, "rank {}: {}: {} is null with {} bytes to move", rank_, call, what, bytes);
}

void ArgChecks::overlap(const char* call, const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes,
                        bool in_place, const char* form, const void* at) const {
  if (send_bytes == 0 || recv_bytes == 0 || !send || !recv || in_place) return;
  RINGFENCE_EXPECTS(disjoint(send, send_bytes, recv, recv_bytes),
                    "rank {}: {}: sendbuff {} ({} bytes) and recvbuff {} ({} bytes) overlap without being the in-place form{}",
                    rank_, call, send, send_bytes, recv, recv_bytes,
                    form ? fmt::format(" ({}, here {})", form, at) : std::string(" (none for this call)"));
}

IoBytes ArgChecks::allreduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type,
                             ReduceOp op) const {
  // The same rules at once for the common call (both buffers given, the same or disjoint): a
  // few instructions where the calls below cost about 150, a tenth of a small allreduce's.
  // Anything else takes the checks that name what is wrong.
  if (const auto bytes = checked_bytes(count, type); bytes && is_valid(op) && send && recv && (send == recv || disjoint(send, *bytes, recv, *bytes)))
    return {*bytes, *bytes};
  this->type(call, type);
  this->op(call, op);
  const std::size_t bytes = bytes_of(call, "count", count, type);
  pointer(call, "sendbuff", send, bytes);
  pointer(call, "recvbuff", recv, bytes);
  overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
  return {bytes, bytes};
}

IoBytes ArgChecks::reduce_scatter(const char* call, const void* send, const void* recv, std::size_t recvcount, DataType type,
                                  ReduceOp op) const {
  this->type(call, type);
  this->op(call, op);
  return blocks(call, "recvcount", recvcount, type, send, recv, true);
}

IoBytes ArgChecks::allgather(const char* call, const void* send, const void* recv, std::size_t sendcount, DataType type) const {
  this->type(call, type);
  return blocks(call, "sendcount", sendcount, type, send, recv, false);
}

// Allows an overlap only in NCCL's in-place form, the single block being block `rank` of the
// whole buffer.
IoBytes ArgChecks::blocks(const char* call, const char* count_name, std::size_t count, DataType type, const void* send,
                          const void* recv, bool send_is_whole) const {
  const std::size_t block = bytes_of(call, count_name, count, type);
  const std::size_t whole = bytes_of(call, count_name, count, type, static_cast<std::size_t>(size_));
  const IoBytes io = send_is_whole ? IoBytes{whole, block} : IoBytes{block, whole};
  pointer(call, "sendbuff", send, io.in);
  pointer(call, "recvbuff", recv, io.out);
  const void* whole_at = send_is_whole ? send : recv;
  const void* block_at = send_is_whole ? recv : send;
  const void* slot = whole_at ? static_cast<const std::byte*>(whole_at) + static_cast<std::size_t>(rank_) * block : nullptr;
  overlap(call, send, io.in, recv, io.out, block_at == slot,
          send_is_whole ? "recvbuff == sendbuff + rank * recvcount elements" : "sendbuff == recvbuff + rank * sendcount elements",
          slot);
  return io;
}

IoBytes ArgChecks::broadcast(const char* call, const void* send, const void* recv, std::size_t count, DataType type,
                             int root) const {
  this->type(call, type);
  this->root(call, root);
  const std::size_t bytes = bytes_of(call, "count", count, type);
  if (rank_ == root) pointer(call, "sendbuff (on the root)", send, bytes);
  pointer(call, "recvbuff", recv, bytes);
  if (rank_ == root) overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
  return {rank_ == root ? bytes : 0, bytes};
}

IoBytes ArgChecks::reduce(const char* call, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                          int root) const {
  this->type(call, type);
  this->op(call, op);
  this->root(call, root);
  const std::size_t bytes = bytes_of(call, "count", count, type);
  pointer(call, "sendbuff", send, bytes);
  if (rank_ == root) {
    pointer(call, "recvbuff (on the root)", recv, bytes);
    overlap(call, send, bytes, recv, bytes, send == recv, "sendbuff == recvbuff", recv);
  }
  return {bytes, rank_ == root ? bytes : 0};
}

IoBytes ArgChecks::alltoall(const char* call, const void* send, const void* recv, std::size_t count, DataType type) const {
  this->type(call, type);
  const std::size_t bytes = bytes_of(call, "count", count, type, static_cast<std::size_t>(size_));
  pointer(call, "sendbuff", send, bytes);
  pointer(call, "recvbuff", recv, bytes);
  overlap(call, send, bytes, recv, bytes, false, nullptr, nullptr);
  return {bytes, bytes};
}

std::size_t ArgChecks::p2p(const char* call, const void* buf, std::size_t count, DataType type, int peer) const {
  this->type(call, type);
  this->peer(call, peer);
  const std::size_t bytes = bytes_of(call, "count", count, type);
  pointer(call, "buf", buf, bytes);
  return bytes;
}

}  // namespace ringfence::detail
