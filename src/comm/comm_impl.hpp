#pragma once
// Communicator::Impl: the communicator as a composition of named parts, each with one job and
// its own header; a part gets the parts it works with as constructor arguments and reaches into
// none of their members. Members are declared in dependency order (a part only refers to parts
// declared before it), so construction wires them and destruction unwinds them; teardown order
// for threads and links is explicit in the destructor. See docs/architecture.md.
#include <memory>
#include <ringfence/communicator.hpp>

#include "../device/device_lane.hpp"
#include "../device/stream_calls.hpp"
#include "../health/agreement_round.hpp"
#include "../health/link_mover.hpp"
#include "../health/reporting.hpp"
#include "async_queue.hpp"
#include "call_check.hpp"
#include "context.hpp"
#include "dispatch.hpp"
#include "failure.hpp"
#include "heartbeat.hpp"
#include "lanes.hpp"
#include "plan_state.hpp"
#include "reg_cache.hpp"

namespace ringfence {

struct Communicator::Impl {
  detail::CommContext ctx;                 // options, logger, rank, size, store, peers, transports
  std::shared_ptr<TcpStoreServer> server;  // when this rank hosts the store (shared with shrunk communicators)
  TransportRegistry registry;              // what setup() used (shrink and split build from it again)
  std::uint64_t shrinks = 0;               // shrink() calls so far (store namespace of the next)
  std::uint64_t splits = 0;                // split() calls so far (store namespace of the next)

  detail::Lanes lanes{ctx};
  detail::PlanState plan;
  detail::CommFailure failure{ctx, lanes};
  detail::CallChecker calls;
  detail::AsyncQueue queue;
  detail::RegistrationCache regs{ctx.log};
  detail::EventSink events;
  detail::DeviceLane device{ctx, lanes, plan, failure};
  detail::LinkMover mover{ctx, lanes, plan, device, failure, regs, events};
  detail::AgreementRound agreement{ctx, lanes, plan, device, mover, events, [this](detail::Plan p) { set_plan(std::move(p)); }};
  std::unique_ptr<detail::Heartbeat> heartbeat;  // null when off
  detail::Dispatch dispatch{detail::DispatchParts{ctx, lanes, plan, failure, calls, queue, device, agreement, regs, events}};
  detail::StreamCalls streams{ctx, failure, device, dispatch};

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  /// Queued work finishes first, then the heartbeat says goodbye, then links close and memory
  /// is freed (never blocking on a peer beyond a bounded goodbye).
  ~Impl();

  /// Builds every part for `ctx` (rank, size, options and store set): transports, peers, lanes,
  /// plan, health. Throws like the Communicator constructor.
  void setup(const TransportRegistry& registry);
  /// Installs `p` in the plan state and wires the lanes and the fingerprint pairs to it.
  void set_plan(detail::Plan p);
  /// `Communicator::health()`.
  HealthSnapshot snapshot() const;
};

}  // namespace ringfence
