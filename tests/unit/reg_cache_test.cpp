// The direct-write registration caches (src/comm/reg_cache.hpp): bounded across calls, but an
// entry the current call used is never dropped, so a registration a peer is still writing into,
// or a region we are writing through, survives until the call ends.
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transport.hpp>
#include <set>
#include <span>
#include <vector>

#include "comm/reg_cache.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using ringfence::detail::RegistrationCache;

namespace {
// Registers memory only, and records which registrations are live (the key is the address).
class CountingTransport final : public Transport {
 public:
  std::set<const void*> live;
  int registrations = 0;

  std::string_view name() const noexcept override { return "counting"; }
  Reachability can_reach(const PeerInfo&, const PeerInfo&) const override { return {}; }
  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    ++registrations;
    live.insert(ptr);
    return MemoryRegion(std::make_unique<Region>(this, ptr), ptr, bytes, kind);
  }
  RemoteRegion import_region(std::span<const std::byte> key) override {
    const void* ptr = nullptr;
    std::memcpy(&ptr, key.data(), sizeof ptr);
    live.insert(ptr);
    return RemoteRegion(std::make_unique<Imported>(this, ptr), 64);
  }
  std::unique_ptr<ListenHandle> listen() override { throw InvalidUsage("not used"); }
  std::unique_ptr<PendingLink> connect(ListenHandle&, const PeerInfo&, std::span<const std::byte>) override {
    throw InvalidUsage("not used");
  }

 private:
  struct Region final : MemoryRegion::Impl {
    Region(CountingTransport* t, const void* p) : owner(t), ptr(p) {}
    ~Region() override { owner->live.erase(ptr); }
    Bytes key() const override {
      Bytes k(sizeof ptr);
      std::memcpy(k.data(), &ptr, sizeof ptr);
      return k;
    }
    CountingTransport* owner;
    const void* ptr;
  };
  struct Imported final : RemoteRegion::Impl {
    Imported(CountingTransport* t, const void* p) : owner(t), ptr(p) {}
    ~Imported() override { owner->live.erase(ptr); }
    CountingTransport* owner;
    const void* ptr;
  };
};

Bytes key_of(const void* p) {
  Bytes k(sizeof p);
  std::memcpy(k.data(), &p, sizeof p);
  return k;
}
}  // namespace

TEST_CASE("registration cache: a hit registers nothing, and past its size the oldest goes unless the current call used it",
          "[direct]") {
  const Logger log;
  constexpr int kEntries = static_cast<int>(RegistrationCache::kEntries);
  std::vector<char> bufs(64 * 128);
  auto at = [&](int i) { return static_cast<void*>(bufs.data() + 64 * i); };

  CountingTransport t;
  RegistrationCache cache(log);
  // One call with 40 registrations at once (a direct receive from each of 40 peers): all stay.
  cache.begin_call();
  for (int i = 0; i < 40; ++i) REQUIRE_FALSE(cache.local_key(at(i), 64, &t).empty());
  CHECK(t.registrations == 40);
  CHECK(t.live.size() == 40);
  // A hit costs no registration and returns the same key.
  const std::span<const std::byte> hit = cache.local_key(at(7), 64, &t);
  CHECK(key_of(at(7)) == Bytes(hit.begin(), hit.end()));
  CHECK(t.registrations == 40);

  // The next call: its first miss drops old entries down to the size (31 plus the new one).
  cache.begin_call();
  REQUIRE_FALSE(cache.local_key(at(40), 64, &t).empty());
  CHECK(t.live.size() == static_cast<std::size_t>(kEntries));
  CHECK(t.live.count(at(0)) == 0);   // the oldest went
  CHECK(t.live.count(at(7)) == 0);   // a hit in an earlier call does not protect it now
  CHECK(t.live.count(at(8)) == 0);
  CHECK(t.live.count(at(39)) == 1);  // the newest stayed
  CHECK(t.live.count(at(40)) == 1);

  // The oldest entry, used again by this call, is not the one a miss drops.
  cache.begin_call();
  void* const oldest = at(9);  // entries 9..40 are left
  REQUIRE(t.live.count(oldest) == 1);
  REQUIRE_FALSE(cache.local_key(oldest, 64, &t).empty());
  REQUIRE_FALSE(cache.local_key(at(41), 64, &t).empty());
  CHECK(t.live.count(oldest) == 1);
  CHECK(t.live.count(at(10)) == 0);  // the oldest this call did not use
  CHECK(t.live.size() == static_cast<std::size_t>(kEntries));
  cache.clear_local();
  CHECK(t.live.empty());

  // Imported peer keys alike: a region this call resolved stays valid through the call.
  CountingTransport u;
  detail::Connection ch;
  ch.peer = 1;
  ch.transport = &u;
  cache.begin_call();
  std::vector<const RemoteRegion*> regions;
  for (int i = 0; i < kEntries; ++i) regions.push_back(cache.import(key_of(at(i)), ch));
  for (const RemoteRegion* r : regions) REQUIRE(r != nullptr);
  cache.begin_call();
  REQUIRE(cache.import(key_of(at(0)), ch) == regions[0]);  // a hit: the same region
  REQUIRE(cache.import(key_of(at(100)), ch) != nullptr);   // a miss with the cache full
  CHECK(u.live.count(at(0)) == 1);                         // used by this call: kept
  CHECK(u.live.count(at(1)) == 0);                         // the oldest unused one went
  CHECK(u.live.size() == static_cast<std::size_t>(kEntries));
  cache.clear_remote();
  CHECK(u.live.empty());
}
