#pragma once
// Moving a link instead of fencing it (docs/health.md "Moving a link"): where a pair that must
// be fenced can move to a fallback transport both ends allow (CommOptions::fallbacks, default
// nvlink -> pcie), its links on every host lane, and on the device lane to a device fallback,
// are reconnected over that transport between collectives: the plan, and so the bytes, stay.
#include <utility>
#include <vector>

#include "../comm/context.hpp"
#include "../comm/failure.hpp"
#include "../comm/lanes.hpp"
#include "../comm/plan_state.hpp"
#include "../comm/reg_cache.hpp"
#include "../device/device_lane.hpp"
#include "monitor.hpp"
#include "reporting.hpp"

namespace ringfence::detail {

class LinkMover {
 public:
  LinkMover(CommContext& ctx, Lanes& lanes, PlanState& plan, DeviceLane& device, CommFailure& failure, RegistrationCache& regs,
            EventSink& events) noexcept
      : ctx_(ctx), lanes_(lanes), plan_(plan), device_(device), failure_(failure), regs_(regs), events_(events) {}

  /// Computes every lane-0 link's fallback (at setup, after the transports were chosen).
  void start();
  /// The transport index our link to `peer` may move to (-1: none), as offered in the ballot.
  int fallback_of(int peer) const noexcept { return fallback_of_[static_cast<std::size_t>(peer)]; }
  /// Applies agreed moves (link, index in the transports): the ends move their links, every
  /// rank judges the link afresh (`monitor`, may be null) and reports it; +1 epoch. Every rank
  /// runs it with the same list. A move that fails fails the communicator and throws.
  void apply(const std::vector<std::pair<LinkId, int>>& moves, HealthMonitor* monitor);
  /// The device lane's side of an agreement: each of our device-lane links whose pair was
  /// agreed fenced or moved moves to its device fallback (nvlink -> pcie by default) when there
  /// is one; `home`: the pairs were readmitted instead, their links move back to the first
  /// device transport that reaches the peer. Both ends decide alike. No-op without a device lane.
  void move_device_links(const std::vector<LinkId>& links, bool home = false);

 private:
  // The transport `ch`'s link may move to: the first allowed pair from its transport to another
  // selected one that reaches the peer; -1 = none. Both ends evaluate it; the pair moves only
  // when both name the same transport.
  int fallback_for(const Connection& ch) const;
  void move_link(int peer, Transport& to);
  void judge_afresh(Connection& ch, Transport& to) const;
  void move_device_link(int peer, Transport& to);
  template <class Drive>
  void meet(const std::string& base, int peer, Transport& to, const char* what, Drive drive);
  void emit(HealthEvent e) noexcept { events_.emit(std::move(e), ctx_.rank, ctx_.seq, plan_.epoch(), ctx_.log); }

  CommContext& ctx_;
  Lanes& lanes_;
  PlanState& plan_;
  DeviceLane& device_;
  CommFailure& failure_;
  RegistrationCache& regs_;
  EventSink& events_;
  std::vector<int> fallback_of_;  // by rank: index in the transports our link to it may move to, -1 = none
};

}  // namespace ringfence::detail
