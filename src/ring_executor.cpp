// The executor's entry points (engine.hpp): each builds a RingRunner (ring_runner.hpp) for one call
// and runs the schedule of the collective it names.
#include "ring_runner.hpp"

namespace ringfence::detail {

// Along a chain one rank's copy or reduction of chunk k overlaps the next rank's work on chunk
// k - 1, but a message of one slot would be a single chunk that the ranks handle one after the
// other; so messages of fewer than kChainPieces slots are cut into kChainPieces chunks. Not
// below 32 KiB: at 64 KiB four 16 KiB chunks ran 19-34 % slower than one (per-chunk costs), two
// of 32 KiB 6-10 % faster (2 ranks: reduce 9.4-9.8 -> 8.7-8.9 µs; 4 ranks within noise); 2 ranks,
// 128-512 KiB gained 7-68 % from quarters (best of 3, docs/tuning.md "Chain chunks"). Both ends
// derive it from the count alone, so they agree on the schedule.
std::size_t chain_chunk(std::size_t count, std::size_t elem, std::size_t slot_bytes) noexcept {
  constexpr std::size_t kChainPieces = 4, kChainMinChunkBytes = 32 * 1024;
  const std::size_t slot = slot_bytes / elem, bytes = count * elem;
  if (bytes >= kChainPieces * slot_bytes) return slot;
  const std::size_t piece = (bytes / kChainPieces + 63) / 64 * 64;  // whole cache lines
  return std::min(slot, std::max(kChainMinChunkBytes, piece) / elem);
}

Status run_ring(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, const RingCall& call,
                const Reducer& reducer, const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept {
  RingRunner runner(config, flags, left, right, reducer, direct, relays, failure);
  runner.check_with(call.check);
  runner.use_device(call.device);
  // On two ranks a ring's received chunk is never passed on: every copy of one (an allreduce's
  // or allgather's second half) writes a final value. A 2-rank broadcast measured no gain (16 MiB
  // 6.6 against 7.5 GB/s, 64-256 MiB within noise), so it keeps the plain copy. Host memory only.
  runner.stream_results(!call.device && config.size == 2 &&
                        (call.kind == RingCollective::Allreduce || call.kind == RingCollective::Allgather) &&
                        call.count * reducer.elem_size >= kStreamResultMinBytes);
  runner.defer_wakes(call.count * reducer.elem_size <= kDeferWakeMaxBytes);
  const std::size_t chunk = config.slot_bytes / reducer.elem_size;
  const int n = config.size;
  const std::size_t count = call.count;
  switch (call.kind) {
    case RingCollective::Allreduce:
      return runner.run([&](int pos) { return RingAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::ReduceScatter:
      return runner.run([&](int pos) { return RingReduceScatterSchedule(pos, n, count, chunk, call.stride, call.blocks); }, call.send, call.recv);
    case RingCollective::Allgather:
      return runner.run([&](int pos) { return RingAllgatherSchedule(pos, n, count, chunk, call.stride, call.blocks); }, call.send, call.recv);
    case RingCollective::Broadcast:
    case RingCollective::Reduce: {
      const std::size_t piece = chain_chunk(count, reducer.elem_size, config.slot_bytes);
      if (call.kind == RingCollective::Broadcast)
        return runner.run([&](int pos) { return ChainBroadcastSchedule(pos, n, call.root, count, piece); }, call.send, call.recv);
      return runner.run([&](int pos) { return ChainReduceSchedule(pos, n, call.root, count, piece); }, call.send, call.recv);
    }
    case RingCollective::TreeAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);  // trees never run on a relayed plan
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return DoubleTreeAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::OneShotAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return OneShotAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::DirectAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return DirectAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
  }
  return Status(ErrorCode::InvalidUsage);
}

Status run_ring_allreduce(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, const void* send, void* recv,
                          std::size_t count, const Reducer& reducer, const DirectWrite& direct, RelayDuties& relays,
                          Failure& failure) noexcept {
  return run_ring(config, flags, left, right, RingCall{RingCollective::Allreduce, send, recv, count, 0}, reducer, direct, relays,
                  failure);
}

bool read_fingerprint(const FlagBlock& flags, CallCheck& check) noexcept {
  const int peer = check.from->peer;
  if (!reached(flags.call[peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(check.mine.sequence))) return false;
  const std::size_t slot = check.mine.sequence % kCallSlots;
  std::memcpy(&check.theirs, flags.call_slot(peer, slot), sizeof check.theirs);
  check.settled = true;
  check.intact = check.theirs.sequence == check.mine.sequence &&
                 check.theirs.crc == crc32c(&check.theirs, offsetof(CallFingerprint, crc));
  return true;
}

Status post_fingerprint(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays,
                        Connection* const* to, std::size_t n_to, const CallFingerprint& mine, Failure& failure, bool spread,
                        std::span<const std::byte> carried) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  return RingRunner(config, flags, left, right, kNoReduce, kNoDirect, relays, failure).post_fingerprint(to, n_to, mine, spread, carried);
}

Status run_carried(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays, CallCheck& check,
                   const void* send, void* recv, std::size_t count, const Reducer& reducer, Failure& failure) noexcept {
  static constexpr DirectWrite kNoDirect{};
  return RingRunner(config, flags, left, right, reducer, kNoDirect, relays, failure)
      .run_carried(check, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), count);
}

Status settle_fingerprint(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays,
                          CallCheck& check, Failure& failure) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  // A carried call's fingerprint is acknowledged once its data passed (RingRunner::run_carried):
  // the peer stops answering re-posts at close once it has that acknowledgement.
  return RingRunner(config, flags, left, right, kNoReduce, kNoDirect, relays, failure).settle_call(check, true, !check.mine.carried);
}

Status run_p2p(const EngineConfig& config, FlagBlock flags, Connection* const* connection_of, P2POp* ops, std::size_t n,
               const P2PDirect& direct, Failure& failure, const DeviceRegions* device, CallCheck* check) noexcept {
  // Point-to-point moves bytes: receives go through `consume` as copies (no combine) of
  // one-byte elements, so checksums are verified in the copy's pass as for ring steps.
  static constexpr Reducer kBytes{nullptr, nullptr, 1};
  static constexpr DirectWrite kNoDirect{};
  RelayDuties none;
  RingRunner runner(config, flags, nullptr, nullptr, kBytes, kNoDirect, none, failure);
  runner.use_device(device);
  runner.check_with(check);
  // Small groups leave waking a sleeping peer to the next wait or the call's end, as small ring
  // calls do (RingRunner::defer_wake; run_p2p flushes before every wait).
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) bytes += ops[i].bytes;
  runner.defer_wakes(bytes <= kDeferWakeMaxBytes);
  return runner.run_p2p(connection_of, ops, n, direct);
}

}  // namespace ringfence::detail

namespace ringfence::detail {

void drain_retained(const EngineConfig& config, FlagBlock flags, std::chrono::steady_clock::time_point deadline) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  RelayDuties none;
  Failure failure;
  RingRunner runner(config, flags, nullptr, nullptr, kNoReduce, kNoDirect, none, failure);
  if (config.checksum) runner.drain_retained(deadline);
  runner.drain_reposts(deadline);
}

}  // namespace ringfence::detail
