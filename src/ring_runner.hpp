#pragma once
// RingRunner: the step executor behind run_ring and run_p2p (engine.hpp). It runs one schedule
// (schedule.hpp) over the call's connections: flow control by staging slots and credits, chunk
// integrity with re-sends, relays around fenced links, direct writes, call fingerprints and
// device regions. Its definitions are split by concern: the data path's waits and chunk
// transfers (ring_runner_flow.cpp), re-sends and relays (ring_runner_integrity.cpp),
// mailboxes and fingerprints (ring_runner_mail.cpp), point-to-point groups
// (ring_runner_p2p.cpp); the schedule loop is here because it is a template over the schedule.
// Nothing here allocates or throws.
//
// The ring executor: runs `RingAllreduceSchedule` steps over two connections.
//
// Flow control per directed link (sender S -> receiver R), message m (0-based):
//   S waits until credit[R] >= m + 1 - slots (R consumed message m - slots, so slot m % slots is
//   free), writes the chunk into R's inbox slot m % slots, then signals data[S] = m + 1 at R.
//   R waits until data[S] >= m + 1, consumes the slot, then signals credit[R] = m + 1 at S.
// `signal` is ordered after the preceding `write` on the same link (SPI guarantee), so R never
// reads a slot before its bytes have landed. Counters never reset, so nothing needs clearing
// between collectives.
//
// Integrity (config.checksum): S also writes a trailer {crc32c, bytes, m} for the slot (in the
// line of R's data flag for S with up to 4 slots, else after the slot: EngineConfig). R
// verifies before consuming; on a mismatch it bumps nack[R] at S and waits for retry[S]. The
// chunk to re-send is the one R is blocked on: number credit[R] (R consumed 0..m-1), so no
// payload-carrying word (which a bad link could corrupt too) names it. S services NACKs inside
// every wait (so no cycle of waiting ranks can form), re-writes the chunk from its source (still intact: nothing downstream of a chunk can
// overwrite its source before the chunk was accepted) and bumps retry[S] at R. At the end of a
// call S waits until R has accepted everything it sent, or leaves copies of what R has not
// (retain_unaccepted: small calls, point-to-point). A corrupted chunk never reaches a result.
// Direct point-to-point (P2PDirect): R publishes its buffer's key, S writes the chunks there and
// R verifies them in place; S waits for their acceptance before it returns. A key S reads
// damaged is asked for with a NACK whose piece word is kRepublishKeyPiece; R posts it again
// and bumps retry[R] (the NACK and retry counters count both kinds alike).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <ringfence/crc32c.hpp>
#include <span>
#include <thread>

#include <ringfence/detail/cuda_api.hpp>
#include "checked_ops.hpp"
#include "device_kernels.hpp"
#include "engine.hpp"

namespace ringfence::detail {

inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class RingRunner {
 public:
  RingRunner(const EngineConfig& c, FlagBlock flags, Connection* left, Connection* right, const Reducer& reducer,
             const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept
      : c_(c),
        flags_(flags),
        left_(left),
        right_(right),
        reducer_(reducer),
        direct_(direct),
        relays_(relays),
        failure_(failure) {}
  // However the call ends, no peer is left asleep on a signal of ours (defer_wake).
  ~RingRunner() { flush_deferred(); }
  RingRunner(const RingRunner&) = delete;
  RingRunner& operator=(const RingRunner&) = delete;

  // Tree mode: steps name peers by ring position; every connection may carry re-send requests.
  void use_positions(Connection* const* by_position, Connection* const* by_rank) noexcept {
    by_position_ = by_position;
    nack_all_ = by_rank;
  }

  // Device regions for this call (see DeviceRegions in engine.hpp); null: host memory.
  void use_device(const DeviceRegions* device) noexcept { dev_ = device; }
  // Received chunks are copied into the output with streaming stores (kStreamResultMinBytes):
  // only where every copy of a received chunk writes a final value the call does not read again.
  void stream_results(bool on) noexcept { stream_results_ = on; }
  // Chunk and credit signals may leave a sleeper's wake-up for later (defer_wake): ring calls
  // of at most kDeferWakeMaxBytes.
  void defer_wakes(bool on) noexcept { defer_wakes_ = on; }

  // Runs the schedule `make(position)` returns for our ring position. `make` also gives each
  // relayed sender's schedule (to know how many of its chunks this call carries).
  template <class Make>
  Status run(Make make, const void* send, void* recv) noexcept {
    if (dev_ && (c_.checksum || c_.trailers || relays_.count > 0 || direct_.enabled))
      return fail_self(Status(ErrorCode::InvalidUsage),
                  "device regions without checksums, trailers, relays or direct writes (they read chunks on the host)", 0);
    const std::size_t elem = reducer_.elem_size;
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    // The schedule works on ring positions; flags and links on ranks.
    auto schedule = make(c_.position);
    RINGFENCE_TRY(start_relays(make));
    if (direct_.enabled) RINGFENCE_TRY(publish_output_key());
    crc_at_send_ = c_.checksum && sends_crc_in_writes();
    const RemoteRegion* peer_out = nullptr;
    bool peer_out_known = false;
    const bool own_out_direct = direct_.enabled && !direct_.own_key.empty();
    // A copy of our input into the output that the next step sends: that send stores it too
    // (CopyAlong, WriteAlso). Where no send follows, it is done on its own.
    CopyAlong along;
    const bool copies_along = !dev_ && (!c_.checksum || crc_at_send_);
    Step step;
    while (schedule.next(step)) {
      const std::size_t off = step.offset * elem, oo = step.out_offset * elem, bytes = step.count * elem;
      if (along.from && step.kind != StepKind::SendFinal) RINGFENCE_TRY(copy_alone(along));
      // Ring schedules talk to the left and right connections (which may be relays); tree
      // schedules name their peers by ring position.
      Connection* const rx_p = by_position_ && step.peer >= 0 ? by_position_[step.peer] : left_;
      Connection* const tx_p =
          by_position_ && step.peer >= 0 ? by_position_[step.kind == StepKind::RecvReduceSend ? step.to : step.peer] : right_;
      if (step.kind == StepKind::CopyInput) {
        if (in + off != out + oo && copies_along) along = CopyAlong{out + oo, in + off, step.count};
        else if (in + off != out + oo) RINGFENCE_TRY(produce(out + oo, in + off, nullptr, step.count, false));
        continue;
      }
      if (step.kind == StepKind::ReduceInputAcc || step.kind == StepKind::ReduceInputAccLast) {
        RINGFENCE_TRY(produce(out + oo, in + off, out + oo, step.count, step.kind == StepKind::ReduceInputAccLast));
        continue;
      }
      Connection& rx = *rx_p;  // every remaining step talks to a peer
      Connection& tx = *tx_p;
      switch (step.kind) {
        case StepKind::CopyInput:
        case StepKind::ReduceInputAcc:
        case StepKind::ReduceInputAccLast: break;  // handled above
        case StepKind::SendInput: RINGFENCE_TRY(send_chunk(tx, in + off, bytes)); break;
        case StepKind::SendOutput: RINGFENCE_TRY(send_chunk(tx, out + oo, bytes)); break;
        case StepKind::SendFinal:
          if (direct_.enabled && !peer_out_known) RINGFENCE_TRY(fetch_peer_output(peer_out));
          peer_out_known = direct_.enabled;
          if (along.from && along.to == out + oo && along.count == step.count && !peer_out) {
            known_ = KnownCrc{};  // as produce() leaves it: the send folds its own CRC
            RINGFENCE_TRY(send_chunk(tx, along.from, bytes, nullptr, 0, along.to));
            along = CopyAlong{};
          } else {
            if (along.from) RINGFENCE_TRY(copy_alone(along));
            RINGFENCE_TRY(send_chunk(tx, out + oo, bytes, peer_out, oo));  // peer_out null: staging
          }
          break;
        case StepKind::RecvReduceSend: {
          // Consume first, then send: a rank blocked on sending must not hold its inbox slot,
          // or a ring of full one-slot links would deadlock. The partial result waits in a
          // scratch slot tied to the outgoing message number m: slot m % (slots + 1) last held
          // message m - slots - 1, accepted before m - 1 could be sent, so a re-send of any
          // unaccepted message still finds its bytes.
          std::byte* tmp = c_.scratch + static_cast<std::size_t>(tx.sent % static_cast<std::uint64_t>(c_.slots + 1)) * c_.slot_bytes;
          RINGFENCE_TRY(consume(rx, tmp, in + off, step.count, false));
          RINGFENCE_TRY(send_chunk(tx, tmp, bytes));
          break;
        }
        case StepKind::RecvCopy:
          if (own_out_direct) {  // the chunk landed in our output: nothing to copy
            const std::byte* data = nullptr;
            std::uint32_t crc = 0;
            RINGFENCE_TRY(wait_chunk(rx, data, out + oo, bytes, &crc));
            known_ = KnownCrc{out + oo, bytes, crc};
            RINGFENCE_TRY(release_chunk(rx));
          } else {
            RINGFENCE_TRY(consume(rx, out + oo, nullptr, step.count, false));
          }
          break;
        case StepKind::RecvReduce: RINGFENCE_TRY(consume(rx, out + oo, in + off, step.count, false)); break;
        case StepKind::RecvReduceLast: RINGFENCE_TRY(consume(rx, out + oo, in + off, step.count, true)); break;
        case StepKind::RecvReduceAcc: RINGFENCE_TRY(consume(rx, out + oo, out + oo, step.count, false)); break;
        case StepKind::RecvReduceAccLast: RINGFENCE_TRY(consume(rx, out + oo, out + oo, step.count, true)); break;
      }
    }
    if (along.from) RINGFENCE_TRY(copy_alone(along));
    return finish_call();
  }

  Status run_p2p(Connection* const* connection_of, P2POp* ops, std::size_t n, const P2PDirect& direct) noexcept;

  Status post_fingerprint(Connection* const* to, std::size_t n_to, const CallFingerprint& mine, bool spread = false,
                          std::span<const std::byte> carried = {}) noexcept;

  // A carried allreduce (engine.hpp run_carried; ring_runner_carried.cpp).
  Status run_carried(CallCheck& check, const std::byte* send, std::byte* recv, std::size_t count) noexcept;

  Status read_call(CallCheck& check, bool block, bool by_word) noexcept;
  // A carried post its receiver looks at while it waits for the post's flag (run_carried,
  // wait_flag: docs/carried-allreduce.md, "Watching the post"): `look` is true once the post's
  // head shows this call's number and its data verifies under our fingerprint's CRC. A post still
  // landing (its head is written first) or damaged fails the CRC: the looks after a failed one
  // skip 1, 2, 4, ... polls, and after kFailedLooks only the flag ends the wait. A failed look
  // counts nothing against the link; only a post whose flag came is judged damaged.
  struct WatchedPost {
    static constexpr int kFailedLooks = 6;
    const std::byte* post = nullptr;
    std::size_t bytes = 0;
    std::uint64_t sequence = 0;
    std::uint32_t fp_crc = 0;
    std::byte* copy = nullptr;  // where a look copies the data it checks (copy_verified)
    int failed = 0, skip = 0;
    bool verified = false;
    bool look() noexcept {
      if (skip > 0) {
        --skip;
        return false;
      }
      return failed < kFailedLooks && posted_sequence() == sequence && verify();
    }
    // The number at the post's head as it is now: the peer may be writing it, so an atomic
    // load, acquiring so the reads of the post that follow are not made before it.
    std::uint64_t posted_sequence() const noexcept {
      static_assert(offsetof(CallPost, fp) + offsetof(CallFingerprint, sequence) == 0);
      return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(post))).load(std::memory_order_acquire);
    }
    bool verify() noexcept;
  };
  // With `watch`, also Ok once `watch->look()` is true (wait_flag).
  Status await_call_post(CallCheck& check, WatchedPost* watch = nullptr) noexcept;
  Status settle_call(CallCheck& check, bool block, bool always_ack, bool by_word = false) noexcept;

  Status verify_call(bool block, Connection* data_from = nullptr) noexcept;
  Status verify_sender(Connection& sender) noexcept;

  // Leaves this call's fingerprint check to the executor (see RingCall::check).
  void check_with(CallCheck* check) noexcept { check_ = check; }

 private:
  // Relay duties: how many chunks each relayed sender sends in this call (its schedule's
  // sends), and the counter bases for passing credits back. Every earlier message on both
  // connections was consumed and credited before this call (earlier calls end only then; a
  // point-to-point call may have left sends to the receiver unaccepted: wait for them).
  template <class Make>
  Status start_relays(Make& make) noexcept {
    for (int i = 0; i < relays_.count; ++i) {
      RelayDuty& d = relays_.duty[i];
      auto theirs = make(d.sender_position);
      std::uint64_t sends = 0;
      for (Step st; theirs.next(st);) sends += static_cast<std::uint64_t>(sends_of(st.kind));
      relay_target_[i] = d.in->received + sends;
      RINGFENCE_TRY(wait_flag(*d.out, flags_.credit[d.out->peer], static_cast<std::uint32_t>(d.out->sent),
                              "acceptance of earlier chunks before relaying", d.out->sent));
      d.base_in = d.in->received;
      d.base_out = d.out->sent;
      d.credited = static_cast<std::uint32_t>(d.base_in);
    }
    return Status::ok();
  }

  Status finish_call() noexcept;

  // ---- device regions (DeviceRegions in engine.hpp) ----

  // `dst = src` over `bytes`: on the executor's stream for device regions, else at once.
  Status copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
    if (!dev_) {
      copy_bytes(dst, src, bytes);
      return Status::ok();
    }
    const int err = dev_->cuda->memcpy_async(dst, src, bytes, kCudaMemcpyDefault, dev_->stream);
    if (err != kCudaSuccess) return fail_self(Status(ErrorCode::Cuda, err), "enqueueing a device copy (cudaMemcpyAsync)", 0);
    dev_pending_ = true;
    return Status::ok();
  }

  // `dst = a op b` over `count` elements (`last`: the final step, which divides for avg).
  Status combine(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count, bool last) noexcept {
    if (!dev_) {
      (last ? reducer_.finish : reducer_.combine)(dst, a, b, count, c_.size);
      return Status::ok();
    }
    const int err = dev_->kernels->launch(reducer_.type, reducer_.op, last, c_.size, dst, a, b, count, dev_->stream);
    if (err != kCudaSuccess) return fail_self(Status(ErrorCode::Cuda, err), "launching a device reduction", 0);
    dev_pending_ = true;
    return Status::ok();
  }

  // ---- checked copies and reductions (checksum mode; checked_ops.hpp) ----

  // `dst = a op b` (b null: `dst = a`) from local operands; with checksums the result's CRC is
  // kept for sending it (known_).
  Status produce(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count, bool last) noexcept;

  Status consume(Connection& rx, std::byte* dst, const std::byte* b, std::size_t count, bool last) noexcept;

  // A copy of `count` input elements into the output, left for the send of the same range
  // (send_chunk's `also`).
  struct CopyAlong {
    std::byte* to = nullptr;
    const std::byte* from = nullptr;
    std::size_t count = 0;
  };
  Status copy_alone(CopyAlong& along) noexcept;

  // Whether every link this call sends on fills WriteOp::crc in its copy
  // (TransportTraits::crc_in_writes). Only a speed question: a link that does not is sent
  // chunks whose CRC the engine computes itself (put_chunk).
  bool sends_crc_in_writes() const noexcept {
    const auto fused = [](const Connection* ch) { return ch && ch->transport && ch->transport->traits().crc_in_writes; };
    if (!by_position_) return fused(right_);
    for (int p = 0; p < c_.size; ++p)
      if (p != c_.position && !fused(by_position_[p])) return false;
    return true;
  }

  // The CRC of bytes this call just produced at `at` (a fused pass computed it), so sending
  // them needs no pass of its own. Every step that writes a range replaces it.
  struct KnownCrc {
    const std::byte* at = nullptr;
    std::size_t bytes = 0;
    std::uint32_t crc = 0;
  };

  // Waits until every copy and reduction enqueued so far has run (before their destinations
  // are sent or their sources handed back). The stream holds only our own work, which depends
  // on nothing but the GPU, so this wait is bounded.
  Status settle_device() noexcept {
    if (!dev_ || !dev_pending_) return Status::ok();
    const int err = dev_->cuda->stream_synchronize(dev_->stream);
    if (err != kCudaSuccess) return fail_self(Status(ErrorCode::Cuda, err), "device copies and reductions (cudaStreamSynchronize)", 0);
    dev_pending_ = false;
    return Status::ok();
  }

  // Calls `f(connection)` for every connection this call may talk to.
  template <class F>
  void for_each_call_connection(F&& f) noexcept {
    if (nack_all_ && !by_position_) {  // point-to-point: every peer's connection
      for (int r = 0; r < c_.size; ++r)
        if (Connection* ch = nack_all_[r]) f(*ch);
    } else if (by_position_) {
      for (int p = 0; p < c_.size; ++p)
        if (Connection* ch = by_position_[p]) f(*ch);
    } else if (c_.size > 1) {
      f(*right_);
      if (left_ != right_) f(*left_);
    }
  }

  Status pump_links() noexcept;
  // Polls `flag` and the relay duties together (ring_runner_flow.cpp says why).
  Status poll_with_relays(SignalFlag& flag, std::uint32_t target) noexcept;
  static constexpr int kRelayPolls = 512;
  static constexpr int kRelayYieldEvery = 16;
  // Polls `flag` and answers re-send requests together, once chunks are being re-sent in this
  // call (`repairing()`; ring_runner_flow.cpp says why). Ok once `flag` reached `target`,
  // InProgress when it did not in time.
  Status poll_serving_nacks(SignalFlag& flag, std::uint32_t target) noexcept;
  bool repairing() const noexcept { return c_.checksum && (resending_ || requested_); }
  // Whether a wait on `ch` polls with poll_serving_nacks first: this call repairs, on the host,
  // over a link whose peer's signals are plain stores (TransportTraits::flags_stored_by_peer).
  bool polls_while_repairing(const Connection& ch) const noexcept {
    return repairing() && !dev_ && ch.transport->traits().flags_stored_by_peer;
  }
  // The re-send requests every wait answers (wait_flag, poll_serving_nacks).
  Status serve_resend_requests() noexcept;
  // Requests for a fingerprint post again (FlagBlock::repost), answered by every wait whatever
  // the checksum mode: a carried allreduce's peer may wait on one in any later call of ours.
  Status serve_reposts() noexcept;
  Status serve_repost(Connection& ch) noexcept;
  static bool copy_verified(const std::byte* post, std::size_t bytes, std::uint32_t fp_crc, std::byte* data) noexcept;
  Status accept_carried(Connection& from, const std::byte* own, const std::byte* data, std::byte* recv, std::size_t count,
                        std::uint32_t number) noexcept;
  Status acknowledge_carried(Connection& from, std::uint32_t number) noexcept;
  Status repair_carried(CallCheck& check, std::size_t slot, std::size_t bytes, std::byte* data) noexcept;
  Status request_repost(Connection& ch, std::size_t slot, std::size_t piece, std::uint32_t& value) noexcept;
  static constexpr int kRepostPollEvery = 64;  // polls of a spinning wait between looks at repost requests
  static constexpr int kServePolls = 2048;
  static constexpr int kServeEvery = 16;
  static constexpr int kServeYieldEvery = 64;

  Status finish_device_call() noexcept;

  Status await_all_delivery() noexcept;

  Status await_acceptance(Connection& ch) noexcept;
  Status await_all_acceptance() noexcept;

  // A peer failed and told everyone (abort word): fail now with its error class, naming it.
  Status check_abort(const char* what, std::uint64_t message) noexcept {
    const std::uint32_t a = flags_.abort->value.load(std::memory_order_acquire);
    if (RINGFENCE_UNLIKELY(a != 0)) {
      failure_ = abort_failure(a, what, message);
      return failure_.status;
    }
    return Status::ok();
  }

  // A failure of our own (bad usage, a device error): no peer to name.
  Status fail_self(Status s, const char* what, std::uint64_t message) noexcept {
    failure_ = Failure{s, -1, what, message};
    return s;
  }

  Status fail(Status s, const Connection& ch, const char* what, std::uint64_t message) noexcept {
    failure_ = Failure{s, ch.peer, what, message};
    if (ch.peer >= 0) failure_.transport = &ch.transport_name;
    return s;
  }

  // With `watch`, also Ok once `watch->look()` is true: looked at in every poll of the spin and
  // between the slices of the sleep.
  Status wait_flag(Connection& ch, SignalFlag& flag, std::uint32_t target, const char* what, std::uint64_t message,
                   WatchedPost* watch = nullptr) noexcept;

  Status drain(Connection& ch, const char* what) noexcept;

  Status publish_output_key() noexcept;

  Status post_mail(Connection& ch, std::uint32_t* header, std::size_t box, std::size_t flag, std::span<const std::byte> key,
                   std::uint32_t number, const char* what) noexcept;

  static bool read_mail(const std::byte* box, std::uint32_t number, std::span<const std::byte>& key) noexcept;

  Status fetch_peer_output(const RemoteRegion*& region) noexcept;

  Status publish_p2p_key(Connection& ch, P2POp& op, const P2PDirect& d) noexcept;
  Status post_p2p_key(Connection& ch, std::span<const std::byte> key, std::uint32_t number, const char* what) noexcept;
  Status republish_p2p_key(Connection& ch) noexcept;

  Status fetch_p2p_key(Connection& ch, P2POp& op, const P2PDirect& d) noexcept;

  // Writes message m (or the piece of it that `piece` names, encode_piece) and, unless the data
  // signal carries it (`with_trailer` false: send_chunk), its trailer.
  // `also`: the first write of m also stores the data there (WriteAlso; the engine copies it
  // where the link did not).
  Status put_chunk(Connection& ch, std::uint64_t m, std::uint32_t piece = 0, bool with_trailer = true,
                   std::byte* also = nullptr) noexcept;
  Status put_piece(Connection& ch, std::uint64_t m, PieceRange p, std::size_t slot) noexcept;
  Status write_data(Connection& ch, const WriteOp& w, const char* what, std::uint64_t m) noexcept;
  Status put_trailer(Connection& ch, std::uint64_t m, std::uint32_t crc, std::size_t bytes) noexcept;
  Status put_call_word(Connection& ch, std::uint64_t m) noexcept;

  // `also`: where the bytes belong locally too (put_chunk).
  Status send_chunk(Connection& ch, const std::byte* src, std::size_t bytes, const RemoteRegion* dst = nullptr,
                    std::size_t dst_offset = 0, std::byte* also = nullptr) noexcept;
  // Whether message `ch.sent` has a free staging slot at `ch`'s receiver: by the credit seen last,
  // else by the credit flag read now. The receiver stores into that flag's line at every chunk it
  // takes, so each read is a transfer between the cores, which a free slot seldom needs.
  bool slot_free(Connection& ch) noexcept {
    const auto slots = static_cast<std::uint64_t>(c_.slots);
    if (ch.sent < slots) return true;
    const auto freed = static_cast<std::uint32_t>(ch.sent + 1 - slots);
    if (reached(ch.credit_seen, freed)) return true;
    ch.credit_seen = flags_.credit[ch.peer].value.load(std::memory_order_acquire);
    return reached(ch.credit_seen, freed);
  }

  // Chunk and credit signals leave waking a sleeping receiver to a later flush
  // (SignalOp::defer_wake): a store that must first see whether anyone sleeps waits until the
  // flag's line is ours, about 0.1 us a signal here, while without that wait the sender goes on
  // (copies aside, the next chunk, the end of the call) as the line travels. This runner flushes
  // those links before it waits on any link (the peer it waits for may be asleep on one of
  // them) and when the call ends (its destructor). Up to kDeferredLinks links; more signal at once.
  // Only in small calls (defer_wakes): between a large chunk's signal and the next wait lies its
  // successor's copy, tens of microseconds a sleeping peer would lie asleep for.
  bool defer_wake(Connection& ch) noexcept {
    if (!defer_wakes_) return false;
    Link* const link = ch.link.get();
    for (int i = 0; i < deferred_n_; ++i)
      if (deferred_[i] == link) return true;
    if (deferred_n_ == kDeferredLinks) return false;
    deferred_[deferred_n_++] = link;
    return true;
  }
  void flush_deferred() noexcept {
    for (int i = 0; i < deferred_n_; ++i) deferred_[i]->flush_wakes();
    deferred_n_ = 0;
  }
  // Whether a chunk of `bytes` to `ch` is copied to its retained area right after it was sent: in
  // a call that will have sent at most kRetainUncheckedBytes, which returns before its receivers
  // accepted its chunks (finish_call), unless it went straight into the receiver's buffer (`dst`:
  // run_p2p waits for those). Copied then, the copy overlaps the receiver's work (at the end of
  // the call it lay between the last receive and the next call's first send) and holds exactly
  // the bytes sent; its area is free, as the slot it copies for is.
  bool retains_at_send(const Connection& ch, const RemoteRegion* dst, std::size_t bytes) const noexcept {
    return c_.checksum && c_.size > 1 && ch.retained && !dst && small_call_copies_aside(bytes_sent_ + bytes);
  }
  // Whether a call that has sent `sent` bytes is small enough that its chunks are copied aside
  // at the send (retains_at_send), so finish_call has nothing left to retain.
  bool small_call_copies_aside(std::size_t sent) const noexcept { return can_copy_aside() && sent <= kRetainUncheckedBytes; }
  // Whether unaccepted chunks can be copied aside at all: lane 0 has retained areas and no
  // relay carries this call's chunks (a relayed chunk is re-sent by its relay).
  bool can_copy_aside() const noexcept { return c_.retained_peers && relays_.count == 0; }

  Status service_all_nacks() noexcept;

  // A direct send that has not read its receiver's buffer key yet: it waits on the p2p mail flag.
  static bool awaits_key(const P2POp& op) noexcept { return op.send && op.direct && !op.keyed; }
  static const char* waiting_for(const P2POp& op) noexcept;
  SignalFlag& awaited_flag(const P2POp& op, const Connection& ch, std::uint32_t& target) noexcept;
  Status spin_for_next(Connection* const* connection_of, const P2POp* ops, std::size_t n, bool& up) noexcept;
  Status spin(SignalFlag& flag, std::uint32_t target, bool& up, WatchedPost* watch = nullptr,
              const std::byte* prefetch = nullptr) noexcept;
  void retain(Connection& ch, std::uint64_t first) noexcept;
  void retain_unaccepted(Connection* const* connection_of) noexcept;
  std::size_t unretained_bytes(Connection& ch) noexcept;
  Status await_p2p_acceptance(Connection* const* connection_of, std::size_t staged) noexcept;
  // Where message m to `ch` is kept once copied aside: its slot's share of the retained area
  // (at most `slots` messages are unaccepted, and m + slots waits for m's credit).
  std::byte* retained_at(const Connection& ch, std::uint64_t m) const noexcept {
    return ch.retained + static_cast<std::size_t>(m % static_cast<std::uint64_t>(c_.slots)) * c_.slot_bytes;
  }
  // Whether message m to `ch` would be lost to a re-send once our caller reuses its buffer:
  // staged (a direct one was waited for) and not copied aside yet.
  bool needs_copy_aside(const Connection& ch, std::uint64_t m) const noexcept {
    const Connection::SentChunk& c = ch.sent_log[m % kSentLog];
    return !c.dst && c.src != retained_at(ch, m);
  }

  std::size_t unaccepted_bytes() noexcept;
  std::uint64_t direct_unaccepted_end(Connection& ch) noexcept;

 public:
  void drain_retained(std::chrono::steady_clock::time_point deadline) noexcept;
  void drain_reposts(std::chrono::steady_clock::time_point deadline) noexcept;

 private:

  Status service_retained() noexcept;

  Status service_relays() noexcept;

  std::uint32_t sender_credit(const RelayDuty& d) const noexcept;

  Status service_nacks(Connection& ch) noexcept;

  Status await_chunk(Connection& ch, const std::byte*& slot) noexcept;

  Status wait_chunk(Connection& ch, const std::byte*& data, const std::byte* landed, std::size_t bytes,
                    std::uint32_t* crc = nullptr) noexcept;

  // The first message to `ch` its receiver has not accepted, from its credit `accepted` (the
  // count accepted, modulo 2^32: at most `slots` behind ch.sent).
  static std::uint64_t first_unaccepted(const Connection& ch, std::uint32_t accepted) noexcept {
    return ch.sent - static_cast<std::uint32_t>(static_cast<std::uint32_t>(ch.sent) - accepted);
  }

  // The trailer of the chunk (or piece) in the slot of message m from `ch`, as it lies here.
  ChunkTrailer trailer_of(const Connection& ch, std::uint64_t m) const noexcept {
    const std::byte* base = c_.trailers_with_flag() ? reinterpret_cast<const std::byte*>(flags_.data) : ch.inbox;
    ChunkTrailer t;
    std::memcpy(&t, base + c_.trailer_at(ch.peer, m), sizeof t);
    return t;
  }

  bool intact(const Connection& ch, std::size_t bytes, std::uint32_t crc) const noexcept {
    const ChunkTrailer t = trailer_of(ch, ch.received);
    return t.message == static_cast<std::uint32_t>(ch.received) && t.bytes == bytes && t.crc == crc;
  }

  // Delivery `attempt` of the chunk `ch` is on ([data, data + bytes)) failed its check: asks for
  // it again, whole, or piece by piece once whole deliveries keep failing; then `repaired` says
  // the bytes were checked piece by piece and are intact (the trailer no longer describes them).
  Status redeliver(Connection& ch, int attempt, const std::byte* data, std::size_t bytes, bool& repaired) noexcept;

  Status repair_in_pieces(Connection& ch, const std::byte* data, std::size_t bytes) noexcept;

  Status request_resend(Connection& ch, std::uint64_t m, std::uint32_t piece = 0) noexcept;

  Status release_chunk(Connection& ch) noexcept;

  const EngineConfig& c_;
  FlagBlock flags_;
  Connection* left_;
  Connection* right_;
  const Reducer& reducer_;
  const DirectWrite& direct_;
  RelayDuties& relays_;
  Failure& failure_;
  bool resending_ = false;  // a peer asked for a re-send in this call: answer the next ones quickly
  bool requested_ = false;  // we asked a peer for a re-send in this call
  std::uint64_t relay_target_[kMaxRelayDuties] = {};
  Connection* const* nack_all_ = nullptr;  // point-to-point mode: connection per rank (null for ourselves)
  Connection* const* by_position_ = nullptr;  // tree mode: connection per ring position (null for ourselves)
  CallCheck* check_ = nullptr;          // this call's fingerprint check, when left to us
  bool settling_ = false;               // settle_call() is waiting
  const DeviceRegions* dev_ = nullptr;  // device regions of this call (null: host memory)
  bool dev_pending_ = false;            // device work enqueued and not yet synchronized
  KnownCrc known_;                      // checksum mode: the CRC of the range written last
  std::size_t bytes_sent_ = 0;          // by this call's send_chunk (kRetainUncheckedBytes)
  bool stream_results_ = false;         // stream_results()
  bool defer_wakes_ = false;            // defer_wakes()
  static constexpr int kDeferredLinks = 8;
  Link* deferred_[kDeferredLinks] = {};  // links with signals whose sleepers are not woken yet (defer_wake)
  int deferred_n_ = 0;
  bool crc_at_send_ = false;            // checksum mode: results' CRCs come from the send's copy (sends_crc_in_writes)
};

}  // namespace ringfence::detail
