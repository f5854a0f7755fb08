#pragma once
// What the health layer tells the outside: events (JSON lines to RINGFENCE_HEALTH_LOG and the
// user's callback), the link table (`links()`), snapshots and the Prometheus text file. Reads the
// lanes; changes nothing in them.
#include <memory>
#include <ringfence/communicator.hpp>
#include <ringfence/events.hpp>
#include <ringfence/log.hpp>
#include <string>
#include <vector>

#include "../comm/lane.hpp"
#include "../comm/plan_state.hpp"
#include "monitor.hpp"

namespace ringfence::detail {

/// Where a communicator's health events go: the callback (`on_health_event`) and the
/// RINGFENCE_HEALTH_LOG file.
class EventSink {
 public:
  EventSink() = default;
  ~EventSink();
  EventSink(const EventSink&) = delete;
  EventSink& operator=(const EventSink&) = delete;

  /// Appends events to `path` (nothing when empty). Throws `SystemError` naming `rank` when it
  /// cannot be opened.
  void open(const std::string& path, int rank);
  /// Replaces the callback (the communicator's thread).
  void set_callback(EventCallback callback) { callback_ = std::move(callback); }
  /// Stamps `e` with the rank, collective number, epoch and time and delivers it. A callback
  /// that throws or a failed write is a warning. Never throws.
  void emit(HealthEvent e, int rank, std::uint64_t seq, std::uint64_t epoch, const Logger& log) noexcept;

 private:
  EventCallback callback_;
  int fd_ = -1;
};

/// One entry per peer of lane 0 with the counters of every host lane's link to it summed, then
/// one per link of the device lane (when built). The caller holds the mutex that guards the
/// connections' links against a move.
std::vector<LinkInfo> collect_links(int rank, const LaneState& lane0, const std::vector<std::unique_ptr<LaneState>>& extra,
                                    const LaneState* device);

/// How often the fence agreements run (`HealthSnapshot::agreements`, `agree_every`).
struct AgreementCount {
  std::uint64_t agreements = 0, every = 0;
};

/// A snapshot of ring, fences and `links` (`Communicator::health()`); `background_samples` from
/// the health monitor (0 without one).
HealthSnapshot make_snapshot(int rank, std::uint64_t seq, const PlanState& plan, const HealthMonitor* monitor, AgreementCount agreed,
                             std::vector<LinkInfo> links);

/// Rewrites the Prometheus text file `path_template` ("{rank}" replaced by the rank) with `h`
/// (tmp + rename: scrapers never see half a file). A failure is a warning. Never throws.
void write_prometheus(const std::string& path_template, int rank, const HealthSnapshot& h, const Logger& log) noexcept;

}  // namespace ringfence::detail
