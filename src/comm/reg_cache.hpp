#pragma once
// Direct-write registration caches: our output and receive buffers registered with a link's
// transport (their keys go to the peer that writes into them), and the peers' keys imported.
// Bounded; a miss allocates (like NCCL's lazy registration), a hit does not.
#include <cstddef>
#include <deque>
#include <mutex>
#include <ringfence/log.hpp>
#include <span>

#include "../engine.hpp"

namespace ringfence::detail {

class RegistrationCache {
 public:
  explicit RegistrationCache(const Logger& log) : log_(log) {}
  /// Key of `ptr` registered with `t` (a miss registers; throws when `t` cannot). A miss drops
  /// the oldest registration only while more than max(32, `min_entries`) are kept: a call
  /// must not lose a registration a peer is still writing into, so `min_entries` must cover
  /// the registrations one call can hold at once (one per peer and lane).
  std::span<const std::byte> local_key(void* ptr, std::size_t bytes, Transport* t, std::size_t min_entries);
  /// Imports a peer's key with `ch`'s transport (a hit allocates nothing); null when the
  /// import fails (logged). Lane workers call it at once: thread-safe.
  const RemoteRegion* import(std::span<const std::byte> key, Connection& ch, std::size_t min_entries) noexcept;
  /// Forgets our registrations (the memory they describe is being freed, or a move changed the
  /// transport).
  void clear_local() noexcept { local_.clear(); }
  /// Forgets the imported keys (they were made for a transport a move replaced).
  void clear_remote() noexcept;

 private:
  struct LocalReg {
    const void* ptr;
    std::size_t bytes;
    MemoryRegion region;
    Bytes key;
  };
  struct RemoteReg {
    Bytes key;
    RemoteRegion region;
  };
  static constexpr std::size_t kEntries = 32;
  const Logger& log_;
  std::deque<LocalReg> local_;  // deques: entries keep their address while others come and go
  std::deque<RemoteReg> remote_;
  std::mutex remote_mutex_;
};

}  // namespace ringfence::detail
