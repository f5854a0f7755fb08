#include "reg_cache.hpp"

#include <algorithm>

namespace ringfence::detail {

std::span<const std::byte> RegistrationCache::local_key(void* ptr, std::size_t bytes, Transport* t, std::size_t min_entries) {
  for (auto& e : local_)
    if (e.ptr == ptr && e.bytes == bytes) return e.key;
  if (local_.size() >= std::max(kEntries, min_entries)) local_.pop_front();
  MemoryRegion region = t->register_memory(ptr, bytes, MemoryKind::Host);
  Bytes key = region.key();
  local_.push_back(LocalReg{ptr, bytes, std::move(region), std::move(key)});
  return local_.back().key;
}

// A group uses at most one key per peer at a time, far below the cache size.
const RemoteRegion* RegistrationCache::import(std::span<const std::byte> key, Connection& ch, std::size_t min_entries) noexcept {
  std::lock_guard lock(remote_mutex_);  // lanes resolve their neighbours' keys at once
  for (auto& e : remote_)
    if (std::equal(e.key.begin(), e.key.end(), key.begin(), key.end())) return &e.region;
  try {
    if (remote_.size() >= std::max(kEntries, min_entries)) remote_.pop_front();
    RemoteRegion region = ch.transport->import_region(key);
    remote_.push_back(RemoteReg{Bytes(key.begin(), key.end()), std::move(region)});
    return &remote_.back().region;
  } catch (const std::exception& e) {
    log_.error("importing rank {}'s buffer failed: {}", ch.peer, e.what());
    return nullptr;
  }
}

void RegistrationCache::clear_remote() noexcept {
  std::lock_guard lock(remote_mutex_);
  remote_.clear();
}

}  // namespace ringfence::detail
