#pragma once
/// \file tuner.hpp
/// The allreduce tuner: an alpha-beta model of the ring and the double binary tree, pure code
/// so it is unit-tested and documented (docs/tuning.md). Every rank evaluates it on the same
/// inputs (size, rank count, options, plan), so every rank picks the same algorithm.

#include <cstddef>
#include <ringfence/options.hpp>

namespace ringfence {

/// Model parameters: per-hop cost and per-link bandwidth.
struct TunerModel {
  double alpha_us = 6.0;  ///< one chunk hop: signal, wake-up, pipeline bubble (microseconds)
  double gbps = 2.0;      ///< bytes a link moves per nanosecond (GB/s)
  /// At two ranks, Auto runs one-shot up to this many bytes whatever the model says (0: the
  /// model alone). Measured, not modelled: a ring hop of a message this small moves a chunk
  /// under ~24 KiB, which crosses between cores at about half the speed of a larger one (its
  /// lines are still in the writer's L1 cache), while one-shot moves the whole message in one
  /// hop (docs/tuning.md, "Two ranks"). Network links keep the model (the communicator sets 0
  /// across hosts and with tcp only); the device lane uses it too, unmeasured there.
  std::size_t pair_oneshot_bytes = 48 * 1024;
};

/// ceil(log2(n)) for n >= 1: the depth of the binary trees.
constexpr int tree_depth(int n) noexcept {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

/// Predicted ring allreduce time in microseconds: 2(n-1) hops of latency, and every rank moves
/// 2(n-1)/n of the message.
constexpr double predict_ring_us(const TunerModel& m, int n, std::size_t bytes) noexcept {
  if (n <= 1) return 0.0;
  const double s = static_cast<double>(bytes) / (m.gbps * 1e3);  // microseconds to move `bytes` once
  return 2.0 * (n - 1) * m.alpha_us + 2.0 * (n - 1) / n * s;
}

/// Bandwidth term of the tree relative to moving the message once: an inner node takes two
/// children's halves in, sends its partial up, takes the final in and sends two copies down,
/// and reduces on the way (fitted on the development machine, docs/tuning.md: 2.75 at 4 ranks).
inline constexpr double kTreeBandwidthFactor = 3.0;

/// Predicted double-binary-tree allreduce time: 2 ceil(log2 n) hops of latency (up, then
/// down) plus `kTreeBandwidthFactor` times the time to move the message once.
constexpr double predict_tree_us(const TunerModel& m, int n, std::size_t bytes) noexcept {
  if (n <= 1) return 0.0;
  const double s = static_cast<double>(bytes) / (m.gbps * 1e3);
  return 2.0 * tree_depth(n) * m.alpha_us + kTreeBandwidthFactor * s;
}

/// Bandwidth term of direct relative to the ring's 2(n-1)/n: the reducing rank takes n-1
/// chunks of one slice in a burst, which costs a little more than the ring's steady stream
/// (fitted on the development machine, docs/tuning.md).
inline constexpr double kDirectBandwidthFactor = 1.1;

/// Predicted direct allreduce time: two hops, each rank posting its n-1 messages of a phase
/// back to back (about a hop each when ranks share cores), and 2(n-1)/n of the message moved
/// like the ring.
constexpr double predict_direct_us(const TunerModel& m, int n, std::size_t bytes) noexcept {
  if (n <= 1) return 0.0;
  const double s = static_cast<double>(bytes) / (m.gbps * 1e3);
  return (n + 1) * m.alpha_us + kDirectBandwidthFactor * 2.0 * (n - 1) / n * s;
}

/// Predicted one-shot allreduce time: one hop, but every rank sends the whole message to each
/// of its n-1 peers and reduces n inputs. (The communicator runs it only up to one chunk.)
constexpr double predict_oneshot_us(const TunerModel& m, int n, std::size_t bytes) noexcept {
  if (n <= 1) return 0.0;
  const double s = static_cast<double>(bytes) / (m.gbps * 1e3);
  return m.alpha_us * n / 2.0 + 2.0 * (n - 1) * s;
}

/// The algorithm for an allreduce of `bytes` on `n` ranks. A `requested` algorithm other than
/// Auto wins where the plan allows it (Tree needs `tree_allowed`: no relayed hop, no fenced tree
/// edge; Direct and OneShot need `direct_allowed`: no fenced link at all), else the ring runs.
/// Auto takes the fastest prediction (ties go to the ring, which relays fenced hops). At two
/// ranks the tree and direct are the ring; only one-shot differs (one hop instead of two), and
/// runs up to `m.pair_oneshot_bytes` whatever the prediction.
constexpr Algorithm choose_allreduce(const TunerModel& m, Algorithm requested, int n, std::size_t bytes, bool tree_allowed,
                                     bool direct_allowed) noexcept {
  if (n <= 1) return Algorithm::Ring;
  if (n == 2 && requested != Algorithm::OneShot && requested != Algorithm::Auto) return Algorithm::Ring;
  if (requested == Algorithm::Tree) return tree_allowed ? Algorithm::Tree : Algorithm::Ring;
  if (requested == Algorithm::Direct || requested == Algorithm::OneShot) return direct_allowed ? requested : Algorithm::Ring;
  if (requested == Algorithm::Ring) return Algorithm::Ring;
  if (n == 2 && direct_allowed && bytes <= m.pair_oneshot_bytes) return Algorithm::OneShot;
  // The fastest predicted; ties go to the ring (it relays fenced hops, so it never changes
  // plan under a fence), then to the tree.
  Algorithm best = Algorithm::Ring;
  double t = predict_ring_us(m, n, bytes);
  if (n > 2 && tree_allowed && predict_tree_us(m, n, bytes) < t) {
    best = Algorithm::Tree;
    t = predict_tree_us(m, n, bytes);
  }
  if (n > 2 && direct_allowed && predict_direct_us(m, n, bytes) < t) {
    best = Algorithm::Direct;
    t = predict_direct_us(m, n, bytes);
  }
  if (direct_allowed && predict_oneshot_us(m, n, bytes) < t) best = Algorithm::OneShot;
  return best;
}

}  // namespace ringfence
