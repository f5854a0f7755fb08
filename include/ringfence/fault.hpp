#pragma once
/// \file fault.hpp
/// Fault injection: a transport decorator that corrupts, delays or stalls the writes of chosen
/// links. Configured by `CommOptions::fault` / `RINGFENCE_FAULT`; drives the integrity and
/// health tests and the demos. Grammar (rules separated by `;`, fields by `,`):
///
///     rule  := kind ':' field (',' field)*
///     kind  := flip | drop | delay | stall | throttle | close | hold
///     field := link=A-B | link=* | rate=<p> | after=<ops> | until=<ops> | for_ms=<milliseconds> | at_ms=<milliseconds>
///            | us=<microseconds>
///            | ms=<milliseconds> | seed=<n>
///            | mbps=<megabytes per second> | transport=<name>
///
/// - `flip:rate=1e-6,link=0-1` flips one random bit per corrupted byte; each byte written on
///   the link between ranks 0 and 1 (either direction) is corrupted with probability `rate`
///   (at most 64 corrupted bytes per write). Signals are not corrupted.
/// - `drop:rate=0.01,link=0-1` silently loses each write on the link with probability `rate`
///   (the write still completes successfully, as a lossy link with a lying NIC would).
/// - `delay:us=200,link=*` sleeps 200 µs before every write.
/// - `stall:after=1000,ms=5000,link=2-3` sleeps 5 s in the 1001st write (a hung peer).
/// - `throttle:mbps=100,link=1-2` makes each write take at least bytes / 100 MB/s (a link that
///   trained down or is congested).
/// - `close:after=20,link=0-1` closes the connection at the 21st write (each end at its own
///   21st write): the link's sockets or mappings go away as when a process closes its end or a
///   cable is pulled; that write and every later operation fail with PeerUnreachable.
/// `transport=shm` (all kinds) limits a rule to the links of that transport (default: every
/// transport), e.g. a corrupting shm link whose pair moves to tcp (`CommOptions::fallbacks`).
/// - `hold:ms=2,link=0-1` holds every signal on the link for 2 ms: it reaches the peer only
///   through a `poll()` or `wait()` on the link after that, and signals still held when the
///   link closes are lost, as with a transport whose signals need the sender's progress
///   (nvlink, behind copies) or a socket closed with bytes unread. `after`/`until`/`for_ms`/
///   `at_ms` do not apply to it.
/// `after=N` (all kinds) leaves the first N writes untouched; `until=M` (M > N) leaves every write
/// after the M-th untouched: the rule acts on writes N+1..M of the link (a fault that heals). Write
/// numbers count per link end (this rank's writes to that peer). `for_ms=T` ends the rule T ms
/// after the first write it acted on (a burst in time). `at_ms=T` leaves untouched every write made
/// less than T ms after the link was connected (a fault that arises later, e.g. while the ranks
/// are idle between collectives). Example:
/// `RINGFENCE_FAULT="flip:rate=1e-5,link=0-1,seed=7;delay:us=50,link=2-3"`.

#include <chrono>
#include <cstdint>
#include <memory>
#include <ringfence/transport.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence {

/// What a rule does.
enum class FaultKind : std::uint8_t { Flip, Drop, Delay, Stall, Throttle, Close, Hold };

/// One parsed rule.
struct FaultRule {
  FaultKind kind = FaultKind::Flip;
  int rank_a = -1;             ///< link end (-1 with rank_b -1: every link)
  int rank_b = -1;             ///< other link end
  double rate = 0.0;           ///< flip: probability per byte; drop: per write; in [0, 1]
  std::uint64_t after = 0;     ///< writes left untouched first
  std::uint64_t until = 0;     ///< last write the rule acts on (0 = no end)
  std::chrono::milliseconds for_ms{0};  ///< the rule stops this long after it first acted (0 = no end)
  std::chrono::milliseconds at_ms{0};   ///< the rule acts only on writes this long after the link connected
  std::chrono::microseconds delay{0};     ///< delay: per write
  std::chrono::milliseconds stall{0};     ///< stall: length of the one stalled write; hold: how long signals are held
  std::uint64_t seed = 1;      ///< flip: random stream seed (mixed with the link's ranks)
  double mbps = 0.0;           ///< throttle: bandwidth cap in 1e6 bytes per second (> 0)
  std::string transport;       ///< only links of this transport ("shm", "tcp", ...); empty = every transport

  /// True when this rule applies to the link between `self` and `peer`.
  bool matches(int self, int peer) const noexcept {
    return rank_a < 0 || (rank_a == self && rank_b == peer) || (rank_a == peer && rank_b == self);
  }
};

/// Parses a fault specification (grammar above). Empty text gives no rules. Throws
/// `InvalidUsage` naming the offending rule or field.
std::vector<FaultRule> parse_fault_spec(std::string_view text);

/// Wraps `inner` so that links created through it apply the `rules` that match them.
/// `self_rank` is this rank. The decorator reports the inner transport's name, and writes no
/// device memory (its links read payloads on the host), so the device lane does not use a
/// transport with rules. Returns `inner` itself when no rule names it (`transport=` of another).
std::unique_ptr<Transport> make_fault_transport(std::unique_ptr<Transport> inner, std::vector<FaultRule> rules,
                                                int self_rank);

}  // namespace ringfence
