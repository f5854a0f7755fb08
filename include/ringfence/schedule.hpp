#pragma once
/// \file schedule.hpp
/// Collective schedules as pure data: a schedule is a function from a step index to a `Step`,
/// computed without allocation from (rank, size, count, chunking). The executor runs steps
/// over links; tests simulate them for many sizes and counts.

#include <cstddef>
#include <cstdint>

namespace ringfence {

/// What one step does. Buffers: `input` (send buffer), `output` (receive buffer), `inbox`
/// (staging slot that the peer's matching Send wrote into).
enum class StepKind : std::uint8_t {
  SendInput,      ///< send input[offset, +count) to `peer`
  SendOutput,     ///< send output[offset, +count) to `peer` (a partial result, into its staging slot)
  SendFinal,      ///< send output[offset, +count) to `peer`, a final value: may go straight into its output
  RecvReduce,     ///< output[offset..] = inbox op input[offset..] (partial result)
  RecvReduceLast, ///< same, producing the final value (avg divides here)
  RecvCopy,       ///< output[offset..] = inbox (or nothing, when the sender wrote the output directly)
  CopyInput,      ///< output[out_offset..] = input[offset..] (local, no peer; nothing when they alias)
  RecvReduceSend, ///< tmp = inbox op input[offset..]; send tmp to `to` (a partial result that is not kept)
  RecvReduceAcc,  ///< output[out_offset..] = inbox op output[out_offset..] (accumulate a further partial)
  RecvReduceAccLast, ///< same, producing the final value (avg divides here)
  ReduceInputAcc,     ///< output[out_offset..] = input[offset..] op output[out_offset..] (local)
  ReduceInputAccLast, ///< same, producing the final value (avg divides here)
};

/// True for the step kinds that send to `Step::peer`.
constexpr bool is_send(StepKind kind) noexcept {
  return kind == StepKind::SendInput || kind == StepKind::SendOutput || kind == StepKind::SendFinal;
}
/// Messages a step sends (to `Step::peer` for sends, to `Step::to` for `RecvReduceSend`).
constexpr int sends_of(StepKind kind) noexcept { return is_send(kind) || kind == StepKind::RecvReduceSend ? 1 : 0; }
/// True for the step kinds that receive from `Step::peer`.
constexpr bool is_recv(StepKind kind) noexcept {
  return kind == StepKind::RecvReduce || kind == StepKind::RecvReduceLast || kind == StepKind::RecvCopy ||
         kind == StepKind::RecvReduceSend || kind == StepKind::RecvReduceAcc || kind == StepKind::RecvReduceAccLast;
}

/// One step of a schedule. Offsets and counts are in elements. Steps that read the input use
/// `offset`; steps that read or write the output use `out_offset` (equal for allreduce).
struct Step {
  StepKind kind = StepKind::CopyInput;
  int peer = -1;            ///< peer for sends and receives, -1 for local steps
  std::size_t offset = 0;   ///< element offset in the input
  std::size_t count = 0;    ///< elements (> 0: empty steps are never produced)
  std::size_t out_offset = 0;  ///< element offset in the output
  int to = -1;              ///< `RecvReduceSend`: where the partial result goes
};

/// Element range [begin, begin + count) of segment `index` when `count` elements are split into
/// `parts` near-equal parts (the first `count % parts` parts hold one extra element).
struct Range {
  std::size_t begin = 0;
  std::size_t count = 0;
};
/// See `Range`. `parts` > 0, `index` < `parts`.
constexpr Range split(std::size_t count, std::size_t parts, std::size_t index) noexcept {
  const std::size_t base = count / parts, extra = count % parts;
  const std::size_t begin = index * base + (index < extra ? index : extra);
  return Range{begin, base + (index < extra ? 1 : 0)};
}

namespace detail {
/// What every schedule does before its own steps: nothing when there is nothing to move, and a
/// single rank's one local copy. Returns 1 with `out` filled, 0 when finished, -1 when the
/// schedule's own steps follow.
constexpr int trivial_step(int size, std::size_t count, bool& done, Step& out) noexcept {
  if (count == 0) return 0;
  if (size != 1) return -1;
  if (done) return 0;
  done = true;
  out = Step{StepKind::CopyInput, -1, 0, count, 0};
  return 1;
}
}  // namespace detail

/// Ring allreduce: reduce-scatter then allgather around the ring rank → rank+1, pipelined in
/// chunks of at most `chunk_elems` elements. Segment s (of `size` near-equal segments) is
/// reduced along the ring starting at rank s and finished by rank s-1 (mod size), so every
/// element is reduced in the same order once and copied to the other ranks: results are
/// bit-identical on every rank.
///
/// Steps are generated on demand: `next(step)` fills `step` and returns false at the end.
/// Each Send to the right neighbour has exactly one matching Recv* at that neighbour, in the
/// same order, so message sequence numbers on a link agree on both ends.
class RingAllreduceSchedule {
 public:
  /// `chunk_elems` > 0. `size` >= 1, 0 <= `rank` < `size`.
  constexpr RingAllreduceSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems) noexcept
      : rank_(rank), size_(size), count_(count), chunk_(chunk_elems ? chunk_elems : 1) {
    const Range largest = split(count, static_cast<std::size_t>(size), 0);
    chunks_ = (largest.count + chunk_ - 1) / chunk_;
  }

  /// Left neighbour (receives come from it).
  constexpr int left() const noexcept { return (rank_ + size_ - 1) % size_; }
  /// Right neighbour (sends go to it).
  constexpr int right() const noexcept { return (rank_ + 1) % size_; }
  /// Number of pipeline chunks per segment.
  constexpr std::size_t chunks() const noexcept { return chunks_; }

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (const int t = detail::trivial_step(size_, count_, done_single_, out); t >= 0) return t == 1;
    // Position: chunk c, ring phase p in [0, 2(n-1)), half h (0 = send, 1 = receive).
    const std::size_t phases = 2 * static_cast<std::size_t>(size_ - 1);
    while (chunk_idx_ < chunks_) {
      const std::size_t c = chunk_idx_, p = phase_;
      const bool recv = half_ == 1;
      if (++half_ == 2) {  // advance the cursor: half, then phase, then chunk
        half_ = 0;
        if (++phase_ == phases) {
          phase_ = 0;
          ++chunk_idx_;
        }
      }
      const std::size_t n = static_cast<std::size_t>(size_);
      const std::size_t r = static_cast<std::size_t>(rank_);
      std::size_t seg;
      StepKind kind;
      if (p < n - 1) {  // reduce-scatter step k = p
        const std::size_t k = p;
        if (!recv) {
          seg = (r + n - k) % n;
          kind = k == 0 ? StepKind::SendInput : StepKind::SendOutput;
        } else {
          seg = (r + 2 * n - k - 1) % n;
          kind = k == n - 2 ? StepKind::RecvReduceLast : StepKind::RecvReduce;
        }
      } else {  // allgather step k = p - (n - 1)
        const std::size_t k = p - (n - 1);
        seg = recv ? (r + n - k) % n : (r + 1 + n - k) % n;
        kind = recv ? StepKind::RecvCopy : StepKind::SendFinal;
      }
      const Range s = split(count_, n, seg);
      const std::size_t begin = c * chunk_;
      if (begin >= s.count) continue;  // this segment has no chunk c: skipped on both ends
      const std::size_t len = s.count - begin < chunk_ ? s.count - begin : chunk_;
      out = Step{kind, recv ? left() : right(), s.begin + begin, len, s.begin + begin};
      return true;
    }
    return false;
  }

 private:
  int rank_;
  int size_;
  std::size_t count_;
  std::size_t chunk_;
  std::size_t chunks_ = 0;
  std::size_t chunk_idx_ = 0;
  std::size_t phase_ = 0;
  int half_ = 0;
  bool done_single_ = false;
};

/// Common shape of the ring schedules below: per pipeline chunk a fixed list of `per_chunk`
/// steps; `make(chunk_begin, chunk_len, index, step)` fills step `index` (false: no such step
/// for this rank). The chunk loop is outermost, so one chunk travels the whole ring before the
/// next starts and each link carries the same message sequence at both ends.
namespace detail {
template <class Derived>
class ChunkedRingSchedule {
 public:
  /// Left neighbour (receives come from it).
  constexpr int left() const noexcept { return (rank_ + size_ - 1) % size_; }
  /// Right neighbour (sends go to it).
  constexpr int right() const noexcept { return (rank_ + 1) % size_; }
  /// Number of pipeline chunks.
  constexpr std::size_t chunks() const noexcept { return chunks_; }

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (const int t = detail::trivial_step(size_, count_, done_single_, out); t >= 0) return t == 1;
    while (chunk_idx_ < chunks_) {
      const std::size_t begin = chunk_idx_ * chunk_;
      const std::size_t len = count_ - begin < chunk_ ? count_ - begin : chunk_;
      const int index = index_;
      if (++index_ == static_cast<const Derived*>(this)->per_chunk()) {
        index_ = 0;
        ++chunk_idx_;
      }
      if (static_cast<const Derived*>(this)->make(begin, len, index, out)) return true;
    }
    return false;
  }

 protected:
  constexpr ChunkedRingSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems, std::size_t stride = 0,
                                const int* blocks = nullptr) noexcept
      : rank_(rank), size_(size), count_(count), stride_(stride ? stride : count), chunk_(chunk_elems ? chunk_elems : 1),
        chunks_((count + chunk_ - 1) / chunk_), blocks_(blocks) {}
  /// (rank + delta) mod size for any delta > -size.
  constexpr std::size_t seg(int delta) const noexcept {
    return static_cast<std::size_t>(((rank_ + delta) % size_ + size_) % size_);
  }
  /// Element offset of the block owned by the ring position `delta` away, in blocked layouts:
  /// the block index is the position's rank when a map is given (a ring that is not 0..n-1).
  constexpr std::size_t block_at(int delta) const noexcept {
    const std::size_t p = seg(delta);
    return (blocks_ ? static_cast<std::size_t>(blocks_[p]) : p) * stride_;
  }
  int rank_;
  int size_;
  std::size_t count_;
  std::size_t stride_;  ///< elements from one block to the next (blocked layouts; = count_ unless a channel's slice)
  std::size_t chunk_;
  std::size_t chunks_;
  const int* blocks_;  ///< block index of each ring position (nullptr: the position itself)

 private:
  std::size_t chunk_idx_ = 0;
  int index_ = 0;
  bool done_single_ = false;
};
}  // namespace detail

/// Ring reduce-scatter: the input holds `size` blocks of `count` elements; rank r ends with
/// block r reduced over all ranks in its output. Block b is reduced along the ring starting at
/// rank b+1 and finished by rank b (n-1 messages per chunk on every link). Partial results are
/// never stored: each arriving chunk is combined with the local block and sent on at once.
class RingReduceScatterSchedule : public detail::ChunkedRingSchedule<RingReduceScatterSchedule> {
 public:
  /// `count`: elements per block (the output's length). `stride` (0 = `count`): elements from
  /// one input block to the next, for a slice of each block (a channel's share). `blocks`
  /// (optional, `size` entries): the block each ring position ends with — its rank, when the
  /// ring is not 0, 1, ..., n-1; `rank` is then a position.
  constexpr RingReduceScatterSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems,
                                      std::size_t stride = 0, const int* blocks = nullptr) noexcept
      : ChunkedRingSchedule(rank, size, count, chunk_elems, stride, blocks) {}
  /// Steps per chunk.
  constexpr int per_chunk() const noexcept { return size_; }
  /// Step `i` of the chunk [begin, begin + len) of every block.
  constexpr bool make(std::size_t begin, std::size_t len, int i, Step& out) const noexcept {
    if (i == 0) {
      out = Step{StepKind::SendInput, right(), block_at(-1) + begin, len, 0};
    } else if (i < size_ - 1) {
      out = Step{StepKind::RecvReduceSend, left(), block_at(-1 - i) + begin, len, 0, right()};
    } else {
      out = Step{StepKind::RecvReduceLast, left(), block_at(0) + begin, len, begin};
    }
    return true;
  }
};

/// Ring allgather: rank r's input (`count` elements) becomes block r of every rank's output
/// (`size` blocks). Each block travels n-1 hops from its owner.
class RingAllgatherSchedule : public detail::ChunkedRingSchedule<RingAllgatherSchedule> {
 public:
  /// `count`: elements per block (the input's length). `stride` (0 = `count`): elements from
  /// one output block to the next, for a slice of each block (a channel's share). `blocks`
  /// (optional): the output block of each ring position's input — its rank, when the ring is
  /// not 0, 1, ..., n-1; `rank` is then a position.
  constexpr RingAllgatherSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems, std::size_t stride = 0,
                                  const int* blocks = nullptr) noexcept
      : ChunkedRingSchedule(rank, size, count, chunk_elems, stride, blocks) {}
  /// Steps per chunk: copy, send, then n-1 receives of which n-2 are forwarded.
  constexpr int per_chunk() const noexcept { return 2 * size_ - 1; }
  /// See `per_chunk`.
  constexpr bool make(std::size_t begin, std::size_t len, int i, Step& out) const noexcept {
    if (i == 0) {
      out = Step{StepKind::CopyInput, -1, begin, len, block_at(0) + begin};
    } else if (i == 1) {  // our block, from the output (the copy above put it there): a final value
      out = Step{StepKind::SendFinal, right(), begin, len, block_at(0) + begin};
    } else {
      const int k = i / 2;  // hop: receive block r-k, forward it unless it went all the way round
      const std::size_t o = block_at(-k) + begin;
      if (i % 2 == 0) out = Step{StepKind::RecvCopy, left(), 0, len, o};
      else out = Step{StepKind::SendFinal, right(), 0, len, o};
    }
    return true;
  }
};

/// Pipelined chain broadcast along the ring from `root`: the root sends its input to its
/// right neighbour, every other rank stores and forwards, the root's left neighbour only stores.
class ChainBroadcastSchedule : public detail::ChunkedRingSchedule<ChainBroadcastSchedule> {
 public:
  /// `root` is a ring position like `rank`.
  constexpr ChainBroadcastSchedule(int rank, int size, int root, std::size_t count, std::size_t chunk_elems) noexcept
      : ChunkedRingSchedule(rank, size, count, chunk_elems), distance_((rank - root + size) % size) {}
  /// Steps per chunk.
  constexpr int per_chunk() const noexcept { return 2; }
  /// See `per_chunk`.
  constexpr bool make(std::size_t begin, std::size_t len, int i, Step& out) const noexcept {
    if (distance_ == 0) {  // the root: copy, then send the copy (a final value, may go straight to the peer's output)
      out = i == 0 ? Step{StepKind::CopyInput, -1, begin, len, begin} : Step{StepKind::SendFinal, right(), begin, len, begin};
      return true;
    }
    if (i == 0) {
      out = Step{StepKind::RecvCopy, left(), begin, len, begin};
      return true;
    }
    if (distance_ == size_ - 1) return false;
    out = Step{StepKind::SendFinal, right(), begin, len, begin};
    return true;
  }

 private:
  int distance_;
};

/// Pipelined chain reduce along the ring into `root`: the root's right neighbour sends its
/// input, every rank after it adds its own and forwards, the root finishes. Every element is
/// reduced in the same ring order.
class ChainReduceSchedule : public detail::ChunkedRingSchedule<ChainReduceSchedule> {
 public:
  /// `root` is a ring position like `rank`.
  constexpr ChainReduceSchedule(int rank, int size, int root, std::size_t count, std::size_t chunk_elems) noexcept
      : ChunkedRingSchedule(rank, size, count, chunk_elems), distance_((rank - root - 1 + 2 * size) % size) {}
  /// Steps per chunk.
  constexpr int per_chunk() const noexcept { return 1; }
  /// See `per_chunk`.
  constexpr bool make(std::size_t begin, std::size_t len, int, Step& out) const noexcept {
    if (distance_ == 0) out = Step{StepKind::SendInput, right(), begin, len, begin};
    else if (distance_ < size_ - 1) out = Step{StepKind::RecvReduceSend, left(), begin, len, begin, right()};
    else out = Step{StepKind::RecvReduceLast, left(), begin, len, begin};
    return true;
  }

 private:
  int distance_;
};

/// One rank's place in a binary tree over `size` ranks: its parent (-1 at the root) and up to
/// two children (-1 when absent), in the order their partial results are combined.
struct TreeNode {
  int parent = -1;
  int child[2] = {-1, -1};
};

/// NCCL's binary tree over ranks 0..size-1 (root 0): rank r's parent clears r's lowest set
/// bit and sets the next one up, falling back to clearing only when that leaves the range.
/// Depth ceil(log2(size)); every rank has at most two children.
constexpr int binary_tree_parent(int rank, int size) noexcept {
  if (rank == 0) return -1;
  int bit = 1;
  while ((rank & bit) == 0) bit <<= 1;
  const int up = (rank ^ bit) | (bit << 1);
  return up < size ? up : rank ^ bit;
}

/// Tree `tree` (0 or 1) of the double binary tree: tree 0 is the binary tree above; tree 1 is
/// its mirror (rank r plays n-1-r) for even sizes and its shift by one for odd sizes, so most
/// leaves of one tree are inner nodes of the other and the two halves of the data load every
/// rank's links about evenly (NCCL's double binary tree).
constexpr TreeNode double_tree_node(int tree, int rank, int size) noexcept {
  auto to_tree = [&](int r) { return tree == 0 ? r : size % 2 == 0 ? size - 1 - r : (r - 1 + size) % size; };
  auto from_tree = [&](int v) { return v < 0 ? -1 : tree == 0 ? v : size % 2 == 0 ? size - 1 - v : (v + 1) % size; };
  const int v = to_tree(rank);
  TreeNode node;
  node.parent = from_tree(binary_tree_parent(v, size));
  int k = 0;
  for (int c = 0; c < size && k < 2; ++c)
    if (c != v && binary_tree_parent(c, size) == v) node.child[k++] = from_tree(c);
  return node;
}

/// Double-binary-tree allreduce: the first half of the data is reduced up tree 0 and broadcast
/// back down it, the second half likewise on tree 1, in pipelined chunks. Latency grows with
/// the depth (2 log2 n hops) instead of the ring's 2(n-1): the choice for small messages on
/// many ranks. Each inner node combines its input, then its first child's partial, then its
/// second's, so every element is reduced in one fixed order and broadcast: results are
/// bit-identical on every rank (but may differ in the last bit from the ring's order).
/// Peers are ranks (positions of the plan); per link both ends see the same message order.
class DoubleTreeAllreduceSchedule {
 public:
  /// `chunk_elems` > 0. `size` >= 1, 0 <= `rank` < `size`.
  constexpr DoubleTreeAllreduceSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems) noexcept
      : rank_(rank), size_(size), count_(count), chunk_(chunk_elems ? chunk_elems : 1) {
    for (int t = 0; t < 2; ++t) {
      node_[t] = double_tree_node(t, rank, size);
      half_[t] = split(count, 2, static_cast<std::size_t>(t));
    }
    chunks_ = (half_[0].count + chunk_ - 1) / chunk_;  // the first half is never the smaller
  }

  /// Tree `t`'s view of this rank.
  constexpr const TreeNode& node(int t) const noexcept { return node_[t]; }

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (const int t = detail::trivial_step(size_, count_, done_single_, out); t >= 0) return t == 1;
    // Cursor: chunk c, phase p (0: up tree 0, 1: up tree 1, 2: down tree 0, 3: down tree 1),
    // sub-step i (at most three per phase).
    while (chunk_idx_ < chunks_) {
      const std::size_t c = chunk_idx_;
      const int p = phase_, i = sub_;
      if (++sub_ == 3) {
        sub_ = 0;
        if (++phase_ == 4) {
          phase_ = 0;
          ++chunk_idx_;
        }
      }
      const int t = p & 1;
      const Range& h = half_[t];
      const std::size_t begin = c * chunk_;
      if (begin >= h.count) continue;
      const std::size_t len = h.count - begin < chunk_ ? h.count - begin : chunk_;
      const std::size_t off = h.begin + begin;
      if (make(t, p < 2, i, off, len, out)) return true;
    }
    return false;
  }

 private:
  // Sub-step i of the up (reduce) or down (broadcast) phase of tree t for [off, off + len).
  constexpr bool make(int t, bool up, int i, std::size_t off, std::size_t len, Step& out) const noexcept {
    const TreeNode& nd = node_[t];
    const int kids = (nd.child[0] >= 0 ? 1 : 0) + (nd.child[1] >= 0 ? 1 : 0);
    const bool root = nd.parent < 0;
    if (up) {
      if (i < kids) {  // combine child i's partial
        const bool last = root && i == kids - 1;
        const StepKind k = i == 0 ? (last ? StepKind::RecvReduceLast : StepKind::RecvReduce)
                                  : (last ? StepKind::RecvReduceAccLast : StepKind::RecvReduceAcc);
        out = Step{k, nd.child[i], off, len, off};
        return true;
      }
      if (i == kids && !root) {  // pass our partial up: our input alone (leaf) or the combination
        out = Step{kids == 0 ? StepKind::SendInput : StepKind::SendOutput, nd.parent, off, len, off};
        return true;
      }
      return false;
    }
    // Down: receive the final value (unless root), then forward it to each child.
    int j = i;
    if (!root) {
      if (i == 0) {
        out = Step{StepKind::RecvCopy, nd.parent, off, len, off};
        return true;
      }
      j = i - 1;
    }
    if (j < kids) {
      out = Step{StepKind::SendFinal, nd.child[j], off, len, off};
      return true;
    }
    return false;
  }

  int rank_;
  int size_;
  std::size_t count_;
  std::size_t chunk_;
  TreeNode node_[2] = {};
  Range half_[2] = {};
  std::size_t chunks_ = 0;
  std::size_t chunk_idx_ = 0;
  int phase_ = 0;
  int sub_ = 0;
  bool done_single_ = false;
};

/// Direct allreduce: the data is cut into `size` slices; every rank sends slice q of its
/// input straight to rank q, rank q reduces its slice from everyone (its own input first, then
/// rank q+1's, q+2's, ... so the order is fixed) and sends the result straight to every rank.
/// Two hops of latency whatever the rank count, n-1 messages in and out per chunk on every rank;
/// every link is used, so it needs a plan without fenced links. Peers are ranks (positions).
class DirectAllreduceSchedule {
 public:
  /// `chunk_elems` > 0. `size` >= 1, 0 <= `rank` < `size`.
  constexpr DirectAllreduceSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems) noexcept
      : rank_(rank), size_(size), count_(count), chunk_(chunk_elems ? chunk_elems : 1) {
    const Range largest = split(count, static_cast<std::size_t>(size), 0);
    chunks_ = (largest.count + chunk_ - 1) / chunk_;
  }

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (const int t = detail::trivial_step(size_, count_, done_single_, out); t >= 0) return t == 1;
    // Cursor: chunk c, phase p (0: scatter, 1: reduce, 2: gather sends, 3: gather receives),
    // k = 1..n-1 (the peer at distance k).
    while (chunk_idx_ < chunks_) {
      const std::size_t c = chunk_idx_;
      const int p = phase_, k = k_;
      if (++k_ == size_) {
        k_ = 1;
        if (++phase_ == 4) {
          phase_ = 0;
          ++chunk_idx_;
        }
      }
      const int fwd = (rank_ + k) % size_, back = (rank_ - k + size_) % size_;
      // Slice whose chunk c this step moves: the peer's (scatter), ours (reduce, gather sends),
      // or the sender's (gather receives).
      const int owner = p == 0 ? fwd : p == 3 ? back : rank_;
      const Range sl = split(count_, static_cast<std::size_t>(size_), static_cast<std::size_t>(owner));
      const std::size_t begin = c * chunk_;
      if (begin >= sl.count) continue;
      const std::size_t len = sl.count - begin < chunk_ ? sl.count - begin : chunk_;
      const std::size_t off = sl.begin + begin;
      switch (p) {
        case 0: out = Step{StepKind::SendInput, fwd, off, len, off}; break;
        case 1: {
          const bool last = k == size_ - 1;
          const StepKind kind = k == 1 ? (last ? StepKind::RecvReduceLast : StepKind::RecvReduce)
                                       : (last ? StepKind::RecvReduceAccLast : StepKind::RecvReduceAcc);
          out = Step{kind, fwd, off, len, off};
          break;
        }
        case 2: out = Step{StepKind::SendFinal, fwd, off, len, off}; break;
        default: out = Step{StepKind::RecvCopy, back, off, len, off}; break;
      }
      return true;
    }
    return false;
  }

 private:
  int rank_;
  int size_;
  std::size_t count_;
  std::size_t chunk_;
  std::size_t chunks_ = 0;
  std::size_t chunk_idx_ = 0;
  int phase_ = 0;
  int k_ = 1;
  bool done_single_ = false;
};

/// One-shot allreduce for small messages: every rank sends its whole input to every peer,
/// then combines all n inputs itself in rank order (0, 1, ..., n-1), so every rank computes the
/// identical expression: one hop of latency, (n-1) times the message on every link.
class OneShotAllreduceSchedule {
 public:
  /// `chunk_elems` > 0. `size` >= 1, 0 <= `rank` < `size`.
  constexpr OneShotAllreduceSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems) noexcept
      : rank_(rank), size_(size), count_(count), chunk_(chunk_elems ? chunk_elems : 1), chunks_((count + chunk_ - 1) / chunk_) {}

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (const int t = detail::trivial_step(size_, count_, done_single_, out); t >= 0) return t == 1;
    // Cursor: chunk c, index i in [0, 2n-1): i < n-1 sends to rank + 1 + i; then the n
    // contributions q = i - (n - 1) in rank order.
    while (chunk_idx_ < chunks_) {
      const std::size_t c = chunk_idx_;
      const int i = index_;
      if (++index_ == 2 * size_ - 1) {
        index_ = 0;
        ++chunk_idx_;
      }
      const std::size_t off = c * chunk_;
      const std::size_t len = count_ - off < chunk_ ? count_ - off : chunk_;
      if (i < size_ - 1) {
        out = Step{StepKind::SendInput, (rank_ + 1 + i) % size_, off, len, off};
        return true;
      }
      const int q = i - (size_ - 1);
      const bool last = q == size_ - 1;
      if (q == 0) {
        out = q == rank_ ? Step{StepKind::CopyInput, -1, off, len, off} : Step{StepKind::RecvCopy, q, off, len, off};
      } else if (q == rank_) {
        out = Step{last ? StepKind::ReduceInputAccLast : StepKind::ReduceInputAcc, -1, off, len, off};
      } else {
        out = Step{last ? StepKind::RecvReduceAccLast : StepKind::RecvReduceAcc, q, off, len, off};
      }
      return true;
    }
    return false;
  }

 private:
  int rank_;
  int size_;
  std::size_t count_;
  std::size_t chunk_;
  std::size_t chunks_;
  std::size_t chunk_idx_ = 0;
  int index_ = 0;
  bool done_single_ = false;
};

}  // namespace ringfence
