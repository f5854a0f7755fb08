#pragma once
// Dispatch: every call after its argument checks. Issues it (now, or queued on the progress
// thread), begins a collective (refuse a broken communicator, count it, post its fingerprint,
// run the fence agreement when due), runs ring, tree, direct and one-shot schedules on the host
// lanes (or on the device lane when the call runs there), point-to-point groups and alltoall,
// and turns a failure into the exception that names the rank, the peer and the link.
#include <chrono>
#include <functional>
#include <memory>
#include <ringfence/tuner.hpp>
#include <ringfence/work.hpp>
#include <utility>
#include <vector>

#include "../call_end.hpp"
#include "../device/device_lane.hpp"
#include "../health/agreement_round.hpp"
#include "../health/reporting.hpp"
#include "../report_coalescer.hpp"
#include "arg_checks.hpp"
#include "async_queue.hpp"
#include "call_check.hpp"
#include "context.hpp"
#include "failure.hpp"
#include "heartbeat.hpp"
#include "lanes.hpp"
#include "plan_state.hpp"
#include "reg_cache.hpp"
#include "stream_choice.hpp"

namespace ringfence::detail {

/// The parts dispatch works with (owned by the communicator).
struct DispatchParts {
  CommContext& ctx;
  Lanes& lanes;
  PlanState& plan;
  CommFailure& failure;
  CallChecker& calls;
  AsyncQueue& queue;
  DeviceLane& device;
  AgreementRound& agreement;
  RegistrationCache& regs;
  EventSink& events;
};

class Dispatch {
 public:
  explicit Dispatch(DispatchParts parts) noexcept : p_(parts) {}

  /// At setup: the tuner's model, the one-shot copy's size (one slot), and the heartbeat (null
  /// when off).
  void start(TunerModel tuner, std::size_t oneshot_bytes, const Heartbeat* heartbeat);
  /// The argument checks for this communicator's rank and size.
  ArgChecks checks() const noexcept { return ArgChecks(p_.ctx.rank, p_.ctx.size); }

  // ---- collectives: checks on the caller's thread, then run now or queue (async) ----
  Work allreduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 CallKind kind = CallKind::Allreduce);
  Work reduce_scatter(bool async, const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op);
  Work allgather(bool async, const void* send, void* recv, std::size_t sendcount, DataType type);
  Work broadcast(bool async, const void* send, void* recv, std::size_t count, DataType type, int root);
  Work reduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root);
  Work alltoall(bool async, const void* send, void* recv, std::size_t count, DataType type);
  /// barrier_async's one-byte allreduce on a token the communicator owns.
  Work barrier_async() { return allreduce(true, &barrier_token_, &barrier_token_, 1, DataType::Uint8, ReduceOp::Max, CallKind::Barrier); }

  // ---- point-to-point ----
  /// send()/recv() on host memory: queued in a group, else run at once. `stream_ops_pending`:
  /// the group already holds stream-ordered transfers (refused: a group takes one kind).
  void send_recv(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer,
                 bool stream_ops_pending);
  void group_start(const char* call);
  /// Ends a group level; true when the outermost one ended (the caller then runs the group:
  /// `run_host_group`, or the stream-ordered one).
  bool group_end(const char* call);
  int group_depth() const noexcept { return group_depth_; }
  bool has_host_ops() const noexcept { return !group_ops_.empty(); }
  /// Runs the queued host transfers (after the queued asynchronous work).
  void run_host_group(const char* call);
  /// Point-to-point has no third party to relay through: a transfer over a fenced link fails
  /// everywhere alike, at once (`ops` is cleared).
  void check_p2p_routes(const char* call, std::vector<P2POp>& ops);
  /// Runs `ops` (consumed) on the host lane 0, or on the device lane during a device-lane call;
  /// from `user_min_bytes` plain user receive buffers take direct writes (cross-memory attach).
  /// `whole_exchange`: every rank runs all of its transfers in this call (alltoall), so those
  /// that fit the slots may go direct too (P2PDirect::whole_exchange).
  void run_ops(const char* call, std::vector<P2POp>& ops, std::size_t user_min_bytes, bool whole_exchange = false,
               CallCheck* check = nullptr);

  // ---- issue ----
  /// Runs `run` now (blocking call: after the queue drained; nothing is allocated) or queues it
  /// (async). The checks already ran on the caller's thread. A gate set by `set_next_gate` runs
  /// first on the progress thread.
  template <class Run>
  Work issue(bool async, const char* call, Run run) {
    if (!async) {  // the gate and end belong to the next queued call (set_next_gate): not this one
      refuse_in_group(call);
      drain();
      apply_timeout(call_timeout_);
      run();
      return Work{};
    }
    std::function<void()> gate = std::exchange(next_gate_, {});  // a stream-ordered call's input gate
    std::shared_ptr<CallEnd> end = std::exchange(next_end_, {});   // and what its end releases
    refuse_in_group(call);
    return p_.queue.push([this, t = call_timeout_, run = std::move(run), gate = std::move(gate), end = std::move(end)] {
      struct Scope {  // the call's path lasts as long as the call; then its stream may go on
        DeviceLane& device;
        CallEnd* end;
        ~Scope() {
          device.leave_call();
          if (end) end->fire();
        }
      } scope{p_.device, end.get()};
      if (gate) gate();  // enters the device lane for a device-lane call
      apply_timeout(t);
      run();
    });
  }
  /// The input gate of the stream-ordered call being issued (see DeviceStager): the next queued
  /// call waits for it first. Empty: none.
  void set_next_gate(std::function<void()> gate) { next_gate_ = std::move(gate); }
  /// What the next queued call fires when it ends, however it ends (CallEnd); null: nothing.
  void set_next_end(std::shared_ptr<CallEnd> end) { next_end_ = std::move(end); }
  /// Waits for every queued call.
  void drain() { p_.queue.drain(); }
  /// set_timeout(): the deadline of the calls issued from now (0 = CommOptions::timeout).
  void set_timeout(std::chrono::milliseconds t) noexcept { call_timeout_ = t; }
  /// The deadline stream-ordered gates wait for.
  std::chrono::milliseconds effective_timeout() const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(call_timeout_.count() > 0 ? call_timeout_ : p_.ctx.options.timeout);
  }
  /// Refuses a communicator that failed (the failure's exception, naming `call`).
  void check_usable(const char* call) const { p_.failure.throw_if_failed(call); }

  /// Turns the data path's failure `f` of `call` into the failed communicator and its exception.
  [[noreturn]] void raise(const char* call, const Failure& f);

 private:
  void apply_timeout(std::chrono::milliseconds t) noexcept;
  void refuse_in_group(const char* call) const;
  void begin_collective(const char* call, CallFingerprint fp, std::span<const std::byte> carried = {});
  // Whether an allreduce of `bytes` is carried by the call fingerprints (docs/carried-allreduce.md).
  bool carries(std::size_t bytes) noexcept;
  void run_carried_call(const char* call, const void* send, void* recv, std::size_t count, const Reducer& reducer);
  void run_staged_allreduce(const char* call, const void* send, void* recv, std::size_t count, std::size_t bytes, const Reducer& reducer);
  // Rewrites the Prometheus file (RINGFENCE_HEALTH_PROMETHEUS) and schedules the next refresh.
  void write_metrics();
  void refresh_metrics_if_due();
  void settle_call(const char* call);
  void judge_call(const char* call);
  void run_ring_call(const char* call, const RingCall& c, const Reducer& reducer, bool direct = false);
  void run_host_ring_call(const char* call, const RingCall& c, const Reducer& reducer, bool direct);
  // Every host lane's EngineConfig::stream_writes.
  void set_stream_writes(bool stream) noexcept;
  // StreamChoice's kinds of call: RingCollective's values, then alltoall.
  static constexpr int kStreamKindAlltoall = 8;
  static_assert(kStreamKindAlltoall < StreamChoice::kKinds);
  // Runs a host collective of `bytes` as StreamChoice plans it (with the current kind of store,
  // or as a trial), then learns from its time; a failed call throws, and its time teaches nothing.
  template <class Run>
  void timed_for_stream_choice(int kind, std::size_t bytes, Run run) {
    const StreamChoice::Call sc = begin_stream_choice(kind, bytes);
    if (!sc.timed) return run();
    const auto started = std::chrono::steady_clock::now();
    run();
    end_stream_choice(sc, started);
  }
  StreamChoice::Call begin_stream_choice(int kind, std::size_t bytes) noexcept;
  void end_stream_choice(const StreamChoice::Call& sc, std::chrono::steady_clock::time_point started);
  void run_device_call(const char* call, const RingCall& c, const Reducer& reducer);
  int lanes_for(const RingCall& c, std::size_t elem_size) const noexcept;
  DirectWrite direct_write_for(LaneState& lane, const RingCall& c, std::size_t elem_size);
  P2PDirect p2p_direct(std::size_t user_min_bytes, bool whole_exchange) noexcept;
  void run_alltoall(const char* call, const void* send, void* recv, std::size_t block);
  CallCheck* exchange_check(const char* call, std::size_t block);
  static const RemoteRegion* resolve_remote(void* ctx, std::span<const std::byte> key) noexcept;

  DispatchParts p_;
  const Heartbeat* heartbeat_ = nullptr;
  TunerModel tuner_;
  std::chrono::steady_clock::time_point metrics_due_{};  // next timed refresh of the Prometheus file
  std::function<void()> next_gate_;            // a stream-ordered call's input gate
  std::shared_ptr<CallEnd> next_end_;          // and what its end releases
  std::chrono::milliseconds call_timeout_{0};  // set_timeout()
  std::vector<std::byte> oneshot_copy_;        // in-place one-shot allreduce input (one slot)
  std::uint8_t barrier_token_ = 0;             // barrier_async's one-byte allreduce
  int group_depth_ = 0;                        // group_start() nesting
  std::vector<P2POp> group_ops_;               // queued by send()/recv() inside a group
  std::vector<P2POp> alltoall_ops_;            // alltoall's transfers (run on the executing thread)
  std::vector<std::byte> alltoall_relay_;      // blocks this rank carries around fenced links
  std::vector<ReportCoalescer> damaged_calls_;  // per peer: fingerprint warnings held back (judge_call)
  StreamChoice stream_choice_;                  // streaming slot writes, chosen again while the job runs
};

}  // namespace ringfence::detail
