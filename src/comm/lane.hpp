#pragma once
// One lane: what the user-facing options call a channel (RINGFENCE_CHANNELS, NCCL's word for a
// set of connections that carries a slice of a collective): the flag block, a connection
// (`detail::Connection`: link, staging slots, counters) to every peer, scratch, and the engine
// configuration that goes with them. Lane 0 runs every call; extra lanes carry slices of large
// ring collectives; the heartbeat and the device lane are lanes of their own. Each lane has its
// own connections, so lanes never share a link or a flag word. In the code "channel" is only
// ever the user-facing lane; the per-peer struct is a connection.
#include <memory>
#include <vector>

#include "../engine.hpp"

namespace ringfence::detail {

struct LaneState {
  EngineConfig engine;
  FlagBlock flags;
  std::vector<std::unique_ptr<Connection>> connections;
  Connection* left = nullptr;
  Connection* right = nullptr;
  RelayDuties relay_duties;  // the relays this rank forwards for
  void* flags_mem = nullptr;
  void* inbox_mem = nullptr;
  void* scratch_mem = nullptr;  // partial results in flight (engine.scratch)
  void* retained_mem = nullptr;  // lane 0: Connection::retained of every connection

  /// The connection to `peer`, made (unconnected) on first use.
  Connection& connection_to(int peer) {
    for (auto& ch : connections)
      if (ch->peer == peer) return *ch;
    connections.push_back(std::make_unique<Connection>());
    connections.back()->peer = peer;
    return *connections.back();
  }
};

/// Polls `ch`'s link once, dropping the completions (they carry nothing the caller needs).
inline void poll_link(Connection& ch) noexcept {
  Completion done[8];
  std::size_t n = 0;
  if (ch.link) (void)ch.link->poll(done, n);
}

}  // namespace ringfence::detail
