#pragma once
// One lane ("channel set" in NCCL's words is what we call a lane; a `detail::Channel` is the
// per-peer end of it): the flag block, a channel (link, staging slots, counters) to every peer,
// scratch, and the engine configuration that goes with them. Lane 0 runs every call; extra lanes
// (RINGFENCE_CHANNELS) carry slices of large ring collectives; the heartbeat and the device lane
// are lanes of their own. Each lane has its own connections, so lanes never share a link or a
// flag word.
#include <memory>
#include <vector>

#include "../engine.hpp"

namespace ringfence::detail {

struct LaneState {
  EngineConfig engine;
  FlagBlock flags;
  std::vector<std::unique_ptr<Channel>> channels;
  Channel* left = nullptr;
  Channel* right = nullptr;
  RelayDuties relay_duties;  // the relays this rank forwards for
  void* flags_mem = nullptr;
  void* inbox_mem = nullptr;
  void* scratch_mem = nullptr;  // partial results in flight (engine.scratch)

  /// The channel to `peer`, made (unconnected) on first use.
  Channel& channel_to(int peer) {
    for (auto& ch : channels)
      if (ch->peer == peer) return *ch;
    channels.push_back(std::make_unique<Channel>());
    channels.back()->peer = peer;
    return *channels.back();
  }
};

/// Polls `ch`'s link once, dropping the completions (they carry nothing the caller needs).
inline void poll_link(Channel& ch) noexcept {
  Completion done[8];
  std::size_t n = 0;
  if (ch.link) (void)ch.link->poll(done, n);
}

}  // namespace ringfence::detail
