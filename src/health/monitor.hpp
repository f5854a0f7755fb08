#pragma once
// Private: the communicator's health monitor. It owns the counter sources (NVML, sysfs) named by
// the link map, a CounterBank of deltas, and one LinkPolicy per judged link: every mapped link,
// and (with checksums on) every link of this rank, judged on what its transport saw. At every
// fence agreement it samples the sources, feeds each policy one observation and reports the
// links' states (the communicator turns "fenced" into a proposal and "cool-down served" into a
// readmission vote).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <ringfence/communicator.hpp>
#include <ringfence/health/counters.hpp>
#include <ringfence/health/nvml_source.hpp>
#include <ringfence/health/options.hpp>
#include <ringfence/health/policy.hpp>
#include <ringfence/health/sysfs_source.hpp>
#include <ringfence/log.hpp>
#include <ringfence/plan.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::detail {

/// Which hardware counters describe one communicator link.
struct LinkSource {
  enum class Kind { Nvml, Ib, Pcie };
  LinkId link;
  Kind kind = Kind::Nvml;
  std::string device;  ///< NVML device index, IB device name, or PCI address
  int port = 0;        ///< NVLink index or IB port (unused for PCIe)
};

/// Parses `A-B=nvml:<gpu>:<nvlink>;A-B=ib:<device>:<port>;A-B=pcie:<domain:bus:dev.fn>`. An
/// entry `auto` (the NVLinks from NVML's topology, resolved by the communicator) sets
/// `*automatic` when given, and is refused otherwise. Throws InvalidUsage naming the entry.
std::vector<LinkSource> parse_link_map(std::string_view text, bool* automatic = nullptr);

/// What this rank's transport saw on one of its links since the previous observation (the
/// transport fields of `health::Evidence`).
struct TransportObservation {
  LinkId link;
  std::uint64_t checksum_mismatches = 0;  ///< corrupted chunks received over the link
  std::uint64_t successes = 0;            ///< chunks sent or received intact
  std::uint64_t timeouts = 0;             ///< operations the transport retried after a deadline
  std::optional<double> bandwidth_ratio;  ///< achieved / expected write bandwidth; nullopt = too little traffic
};

class HealthMonitor {
 public:
  /// Opens the sources the map needs (missing sources are logged and read as unknown) and
  /// creates a policy for every mapped link and every link in `transport_links`.
  HealthMonitor(const health::HealthOptions& options, std::vector<LinkSource> map, std::vector<LinkId> transport_links,
                const Logger& log);

  /// True when any link is judged (mapped to hardware counters, or watched through its transport).
  bool active() const noexcept { return !policies_.empty(); }

  /// One judged link's policy state after an evaluation.
  struct Assessment {
    LinkId link;
    health::PolicyState state = health::PolicyState::Healthy;
    std::string why;  ///< the verdict's reasons (fenced links), or the transition's reasons
    std::optional<health::Transition> change;  ///< the state change this observation caused
  };
  /// Samples every source once and feeds each judged link's policy one observation: its
  /// hardware evidence (mapped links) plus `transport` (links of this rank; a link without an
  /// entry saw nothing). Returns every judged link's state. `now` is the steady clock. Thread-safe.
  std::vector<Assessment> evaluate(health::TimePoint now, std::span<const TransportObservation> transport = {});
  /// The communicator fenced `link` (agreement, e.g. for checksum errors): its policy serves a
  /// cool-down before the link may be readmitted. No-op for unmapped links. Thread-safe.
  void fence(LinkId link, const std::string& reason, health::TimePoint now);

  /// Every rank agreed to move `link` to another transport instead of fencing it: its policy
  /// starts again (a fresh link, healthy, nothing against it), and the hardware counters mapped
  /// to it are dropped: they describe the path it no longer takes (an NVLink, an HCA port). A
  /// link left with neither transport evidence (`transport_links`) nor a source is no longer
  /// judged. Thread-safe.
  void moved(LinkId link);

  /// Reads every source once into the counter bank (deltas, windows). Thread-safe.
  void sample(health::TimePoint now);

  /// Starts the background sampler (one thread, sampling every `interval`). Explicit, like
  /// every ringfence thread; `stop()` or the destructor joins it. No-op when inactive.
  void start(std::chrono::milliseconds interval);
  /// Stops and joins the sampler. Idempotent, never throws.
  void stop() noexcept;
  /// The raw value and window sum of every counter of every mapped link, as last sampled.
  /// Thread-safe.
  std::vector<ringfence::HardwareCounter> counter_values() const;
  /// Background samples taken so far.
  std::uint64_t background_samples() const noexcept { return background_samples_.load(std::memory_order_relaxed); }

  ~HealthMonitor();

 private:
  void sample_locked(health::TimePoint now);

  mutable std::mutex mutex_;  // guards the sources, the bank and the policies
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread sampler_;
  std::atomic<std::uint64_t> background_samples_{0};
  health::HealthOptions options_;
  std::vector<LinkSource> map_;
  const Logger& log_;
  std::unique_ptr<health::NvmlSource> nvml_;
  std::unique_ptr<health::SysfsSource> sysfs_;
  health::CounterBank bank_;
  std::map<std::pair<int, int>, health::LinkPolicy> policies_;  // every judged link
  std::vector<LinkId> transport_links_;                          // links judged on their transport's evidence
};

}  // namespace ringfence::detail
