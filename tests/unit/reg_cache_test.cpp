// The direct-write registration cache (src/comm/reg_cache.hpp): bounded, but never below what one
// call holds at once, so a registration a peer is still writing into is not dropped mid-call.
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transport.hpp>
#include <set>
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
  RemoteRegion import_region(std::span<const std::byte>) override { throw InvalidUsage("not used"); }
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
};
}  // namespace

TEST_CASE("registration cache: a hit registers nothing, and past its size the oldest goes unless one call needs more",
          "[direct]") {
  const Logger log;
  CountingTransport t;
  std::vector<char> bufs(64 * 64);
  auto at = [&](int i) { return static_cast<void*>(bufs.data() + 64 * i); };

  RegistrationCache cache(log);
  // A call with 40 registrations at once (e.g. a direct receive from each of 40 peers): all stay.
  for (int i = 0; i < 40; ++i) REQUIRE_FALSE(cache.local_key(at(i), 64, &t, 40).empty());
  CHECK(t.registrations == 40);
  CHECK(t.live.size() == 40);
  for (int i = 0; i < 40; ++i) CHECK(t.live.count(at(i)) == 1);
  // A hit costs no registration and returns the same key.
  const auto key = cache.local_key(at(7), 64, &t, 40);
  CHECK(t.registrations == 40);
  const void* in_key = nullptr;
  std::memcpy(&in_key, key.data(), sizeof in_key);
  CHECK(in_key == at(7));

  // Without such a call the cache keeps 32: the oldest registration goes first.
  RegistrationCache small(log);
  CountingTransport u;
  for (int i = 0; i < 33; ++i) REQUIRE_FALSE(small.local_key(at(i), 64, &u, 4).empty());
  CHECK(u.live.size() == 32);
  CHECK(u.live.count(at(0)) == 0);
  CHECK(u.live.count(at(32)) == 1);
  small.clear_local();
  CHECK(u.live.empty());
}
