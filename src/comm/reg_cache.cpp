#include "reg_cache.hpp"

#include <algorithm>

namespace ringfence::detail {

std::span<const std::byte> RegistrationCache::local_key(void* ptr, std::size_t bytes, Transport* t) {
  for (auto& e : local_)
    if (e.ptr == ptr && e.bytes == bytes) {
      e.call = call_;
      return e.key;
    }
  MemoryRegion region = t->register_memory(ptr, bytes, MemoryKind::Host);
  Bytes key = region.key();
  make_room(local_);
  local_.push_back(LocalReg{ptr, bytes, std::move(region), std::move(key), call_});
  return local_.back().key;
}

const RemoteRegion* RegistrationCache::import(std::span<const std::byte> key, Connection& ch) noexcept {
  std::lock_guard lock(remote_mutex_);  // lanes resolve their neighbours' keys at once
  for (auto& e : remote_)
    if (std::equal(e.key.begin(), e.key.end(), key.begin(), key.end())) {
      e.call = call_;
      return &e.region;
    }
  try {
    RemoteRegion region = ch.transport->import_region(key);
    make_room(remote_);
    remote_.push_back(RemoteReg{Bytes(key.begin(), key.end()), std::move(region), call_});
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
