#pragma once
// Direct-write registration caches: our output and receive buffers registered with a link's
// transport (their keys go to the peer that writes into them), and the peers' keys imported.
// Bounded; a miss allocates (like NCCL's lazy registration), a hit does not. An entry the
// current call used is never dropped: a peer may still write into that buffer, or we through
// that region, until the call ends.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <mutex>
#include <ringfence/log.hpp>
#include <span>

#include "../engine.hpp"

namespace ringfence::detail {

class RegistrationCache {
 public:
  explicit RegistrationCache(const Logger& log) : log_(log) {}
  /// Marks the start of a call (dispatch thread, before its lanes run): entries used from now
  /// on belong to it and stay until the next call starts.
  void begin_call() noexcept { ++call_; }
  /// Key of `ptr` registered with `t` (a miss registers; throws when `t` cannot). A miss with
  /// `kEntries` or more kept first drops the oldest entries the current call has not used.
  std::span<const std::byte> local_key(void* ptr, std::size_t bytes, Transport* t);
  /// Imports a peer's key with `ch`'s transport (a hit allocates nothing); null when the
  /// import fails (logged). The region stays valid until a later call. Lane workers call it at
  /// once: thread-safe.
  const RemoteRegion* import(std::span<const std::byte> key, Connection& ch) noexcept;
  /// Forgets our registrations (the memory they describe is being freed, or a move changed the
  /// transport).
  void clear_local() noexcept { local_.clear(); }
  /// Forgets the imported keys (they were made for a transport a move replaced).
  void clear_remote() noexcept;
  /// Entries kept across calls; a call may hold more while it runs (each one it uses).
  static constexpr std::size_t kEntries = 32;

 private:
  struct LocalReg {
    const void* ptr;
    std::size_t bytes;
    MemoryRegion region;
    Bytes key;
    std::uint64_t call;  // the last call that used it
  };
  struct RemoteReg {
    Bytes key;
    RemoteRegion region;
    std::uint64_t call;
  };
  // Drops the oldest entries of `list` that the current call has not used until one more fits
  // under kEntries (or none is left to drop: the call holds them all).
  template <class List>
  void make_room(List& list) noexcept {
    for (auto it = list.begin(); list.size() >= kEntries && it != list.end();)
      it = it->call != call_ ? list.erase(it) : std::next(it);
  }
  const Logger& log_;
  std::uint64_t call_ = 0;
  std::list<LocalReg> local_;  // lists: entries keep their address while others come and go
  std::list<RemoteReg> remote_;
  std::mutex remote_mutex_;
};

}  // namespace ringfence::detail
