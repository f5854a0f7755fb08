#pragma once
/// \file events.hpp
/// Health events: every state change the health layer makes (checksum errors seen, fence
/// proposals, fences, re-plans, "no plan") is one `HealthEvent`, delivered to the
/// communicator's callback and, with `RINGFENCE_HEALTH_LOG=path`, appended to a JSON-lines file
/// that `ringfence-health` summarises.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace ringfence {

/// What happened.
enum class EventKind : std::uint8_t {
  ChecksumErrors,  ///< `count` corrupted chunks arrived over link a-b since the last such event (reported at agreements and
                   ///< after point-to-point calls: the first at once, then at most one a second per link with the sum)
  FenceProposed,   ///< this rank proposed fencing link a-b
  LinkFenced,      ///< every rank agreed: link a-b is fenced
  Replanned,       ///< new plan in `detail`: ring (ranks joined by '-') and relays ("relays x->z->y"), epoch `epoch`
  NoPlan,          ///< link a-b must be fenced but neither a relay nor a ring avoids the fenced links
  DigestMismatch,  ///< rank `count`'s output digest differs from a strict majority's; without a majority, `count` is `kDigestNoRank` and the outputs start to disagree over link a-b (`detail` lists digests)
  LinkReadmitted,  ///< every rank agreed: fenced link a-b served its cool-down with clean counters and is back in the plan
  LinkSuspect,     ///< this rank's policy made link a-b suspect (still in use, watched); `detail` = the rules that fired
  LinkHealthy,     ///< this rank's policy cleared link a-b (suspicion or probation over); `detail` = why
  LinkMoved,       ///< every rank agreed: link a-b, which had to be fenced, moved to another transport; `detail` = "from -> to"
  LinkSlow,        ///< link a-b's writes were persistently far slower than the job's median link on its transport; `detail` = measured vs median GB/s; it is fenced (or moved) by the same agreement
  Straggler,       ///< rank `count` is slow (two or more of its links to different peers slow at once): reported, no link fenced; `detail` = its links' speeds vs the median
};

/// `HealthEvent::count` of a `DigestMismatch` that names a link, not a rank.
inline constexpr std::uint64_t kDigestNoRank = ~std::uint64_t{0};

/// "checksum_errors", "fence_proposed", "link_fenced", "replanned", "no_plan", "digest_mismatch",
/// "link_readmitted", "link_suspect", "link_healthy", "link_moved", "link_slow", "straggler".
std::string_view to_string(EventKind kind) noexcept;
/// Inverse of `to_string(EventKind)`.
std::optional<EventKind> parse_event_kind(std::string_view name) noexcept;

/// One health event. Plain value.
struct HealthEvent {
  EventKind kind = EventKind::ChecksumErrors;
  int rank = -1;               ///< rank that reports it
  int a = -1;                  ///< link end (lower rank), -1 when not about a link
  int b = -1;                  ///< link end (higher rank)
  std::uint64_t sequence = 0;  ///< collective sequence number at which it happened
  std::uint64_t epoch = 0;     ///< plan epoch after the event
  std::uint64_t count = 0;     ///< kind-specific count (e.g. corrupted chunks)
  std::string detail;          ///< kind-specific text (e.g. the new ring)
  double unix_time = 0.0;      ///< seconds since the epoch, wall clock
};

/// One JSON object on one line (no trailing newline), keys: event, rank, link, seq, epoch,
/// count, detail, time.
std::string to_json(const HealthEvent& event);
/// Parses a line made by `to_json`; nullopt for anything else (never throws).
std::optional<HealthEvent> parse_event_json(std::string_view line) noexcept;

/// Receives events; called on the thread that runs the collective, must not call back into the
/// communicator, should return quickly.
using EventCallback = std::function<void(const HealthEvent&)>;

}  // namespace ringfence
