// Copies and reductions with their checksums (checked_ops.hpp). Where the CPU folds CRCs with
// AVX-512 (crc32c_fold.hpp), copies and float32 sums up to a slot fold the very registers they
// load, in one loop (fold_pieces); other passes run their kernel over 2 KiB groups and fold each
// group after it (fold_along), so on a memory-bound pass the CRCs cost little more than the
// pass. Elsewhere the pass and the CRCs take turns over blocks that stay in the L1 cache. A
// sender's small copy into a peer's slot copies first and folds after (staging_copy_crc).
#include "checked_ops.hpp"

#include <algorithm>
#include <cstring>
#include <ringfence/crc32c.hpp>

#include "crc32c_fold.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ringfence::detail {
namespace {

// Bytes the pass handles per call of the type-erased kernel on the folding path: long enough
// that the call costs nothing next to the work, short enough that the group is still in the
// cache when it is folded.
constexpr std::size_t kGroupBytes = 2048;

#if defined(RINGFENCE_CRC_X86)
// Folds `bytes` (a multiple of 256) at `p` into `s`, starting it on the first 256.
RF_FOLD_TARGET inline void fold_group(crcfold::Stream& s, bool& started, const std::byte* p, std::size_t bytes, std::uint32_t raw) noexcept {
  const auto* q = reinterpret_cast<const unsigned char*>(p);
  std::size_t i = 0;
  if (!started) {
    s = crcfold::start(q, raw);
    started = true;
    i = crcfold::kStreamBytes;
  }
  for (; i < bytes; i += crcfold::kStreamBytes) crcfold::step(s, q + i);
}

// `pass(offset, bytes)` over [0, bytes) in groups, folding the bytes of `x` (and of `y` when
// not null) after each group. Returns the CRCs (final, inverted) through `cx` and `cy`.
template <class Pass>
RF_FOLD_TARGET void fold_along(Pass pass, const std::byte* x, const std::byte* y, std::size_t bytes, std::size_t elem,
                               std::uint32_t* cx, std::uint32_t* cy) noexcept {
  crcfold::Stream sx, sy;
  bool started_x = false, started_y = false;
  // Whole 256-byte pieces and whole elements per group (elem divides 256 for every type).
  const std::size_t body = bytes / crcfold::kStreamBytes * crcfold::kStreamBytes / elem * elem;
  std::size_t at = 0;
  while (at < body) {
    const std::size_t n = std::min(kGroupBytes, body - at);
    pass(at, n);
    fold_group(sx, started_x, x + at, n, ~0u);
    if (y) fold_group(sy, started_y, y + at, n, ~0u);
    at += n;
  }
  if (at < bytes) pass(at, bytes - at);
  const auto* tx = reinterpret_cast<const unsigned char*>(x + at);
  *cx = started_x ? ~crcfold::finish(sx, tx, bytes - at) : crc32c(x, bytes);
  if (y) *cy = started_y ? ~crcfold::finish(sy, reinterpret_cast<const unsigned char*>(y + at), bytes - at) : crc32c(y, bytes);
}

// Up to a pipeline chunk (cache-resident: a staging slot) a pass and the folding run in one
// loop over the same registers: the loads of the next 256 bytes issue while the last ones fold,
// so a chunk another core just wrote costs little more than its plain pass. Larger copies keep
// copy_bytes (its non-temporal path) in groups.
constexpr std::size_t kFusedMaxBytes = std::size_t{256} << 10;

// Copies fewer than 256 bytes (`bytes` < 256) with masked 512-bit loads, all issued before the
// first store, and masked stores: no byte outside either range is touched. For a peer's post,
// whose lines come from the other core, glibc's memcpy of 65-255 bytes took a 2-rank carried
// allreduce of 128-192 B 0.1-0.2 us longer than one of 64 or 256 B in the VM's slow phase, and
// slower than Open MPI there; this copy does not (docs/carried-allreduce.md, "Short copies").
__attribute__((target("avx512f,avx512bw"))) void copy_masked_short(unsigned char* dst, const unsigned char* src,
                                                                  std::size_t bytes) noexcept {
  const auto mask = [bytes](std::size_t k) -> __mmask64 {
    const std::size_t left = bytes - 64 * k;
    return left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
  };
  __m512i v[4];
  const std::size_t n = (bytes + 63) / 64;
  for (std::size_t k = 0; k < n; ++k) v[k] = _mm512_maskz_loadu_epi8(mask(k), src + 64 * k);
  for (std::size_t k = 0; k < n; ++k) _mm512_mask_storeu_epi8(dst + 64 * k, mask(k), v[k]);
}

// Whether this CPU runs copy_masked_short (AVX-512F and BW).
bool copies_masked() noexcept {
  static const bool available = [] {  // decided once, never changed
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return available;
}

// How far ahead of its loads a receiver's fused pass prefetches a chunk that comes from memory
// (checked_ops.hpp, CheckedSource): the folding holds the loop to about 16 bytes a cycle, too
// slow for the out-of-order window alone to keep enough of those lines in flight. 4 KiB ahead
// made 2-rank checked allreduces and reduces of 256 KiB about a third faster on the AMD VM, 2 KiB
// gained less, 8 KiB the same (docs/protection-cost-amd.md, "Prefetching ahead of the folding").
constexpr std::size_t kPrefetchAheadBytes = 4096;

// Prefetches the 256 bytes `kPrefetchAheadBytes` past `at` in [p, p + end), nothing past `end`:
// the lines after a chunk may be a slot the other core is writing. Always inlined: GCC 12 takes a
// function whose only effect is a prefetch for one without effects and drops the call.
RF_FOLD_TARGET __attribute__((always_inline)) inline void prefetch_ahead(const unsigned char* p, std::size_t at,
                                                                        std::size_t end) noexcept {
  if (at + kPrefetchAheadBytes >= end) return;
  for (int k = 0; k < 4; ++k) _mm_prefetch(reinterpret_cast<const char*>(p + at + kPrefetchAheadBytes + 64 * k), _MM_HINT_T0);
}

// The stream over [0, body) (body: a nonzero multiple of 256) of the blocks `piece(at)` returns:
// the registers its pass loaded at `at` to do its own work there.
template <class Piece>
RF_FOLD_TARGET crcfold::Stream fold_pieces(std::size_t body, Piece piece) noexcept {
  crcfold::Stream s = crcfold::start(piece(0), ~0u);
  for (std::size_t at = crcfold::kStreamBytes; at < body; at += crcfold::kStreamBytes) crcfold::step(s, piece(at));
  return s;
}

// `kStream`: streaming stores (dst 64-byte aligned), whose lines are neither read first nor kept
// in the cache; fenced before the tail and the return. Scalar `crc32` lanes beside the folding
// (a hybrid CRC) made the copy 1.15x faster in the cache and a 2-rank allreduce's checked
// 32-128 KiB calls slower (docs/protection-cost-amd.md, "The hybrid again, narrower").
// `kTailOfCopy`: the bytes after the last whole 256 are folded from `dst` once copied, so the CRC
// is of exactly what was written even where `src` changes meanwhile (copy_crc_of_copy).
// `kAlso`: every block is stored at `also_b` too (plain stores: a sender's own output, which its
// user reads next), from the same loads (staging_copy2_crc).
template <bool kStream, bool kTailOfCopy = false, bool kPrefetch = false, bool kAlso = false>
RF_FOLD_TARGET std::uint32_t copy_fold(std::byte* dst_b, const std::byte* src_b, std::size_t bytes,
                                       std::byte* also_b = nullptr) noexcept {
  auto* dst = reinterpret_cast<unsigned char*>(dst_b);
  auto* also = reinterpret_cast<unsigned char*>(also_b);
  const auto* src = reinterpret_cast<const unsigned char*>(src_b);
  const std::size_t body = bytes / crcfold::kStreamBytes * crcfold::kStreamBytes;
  const crcfold::Stream s = fold_pieces(body, [&](std::size_t at) RF_FOLD_TARGET {
    if constexpr (kPrefetch) prefetch_ahead(src, at, body);
    const crcfold::Block x = crcfold::load(src + at);
    if constexpr (kStream) {
      for (int k = 0; k < 4; ++k) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + at + 64 * k), x.v[k]);
    } else {
      crcfold::store(dst + at, x);
    }
    if constexpr (kAlso) crcfold::store(also + at, x);
    return x;
  });
  if constexpr (kStream) _mm_sfence();
  if (bytes > body) std::memcpy(dst + body, src + body, bytes - body);
  if (kAlso && bytes > body) std::memcpy(also + body, src + body, bytes - body);
  return ~crcfold::finish(s, (kTailOfCopy ? dst : src) + body, bytes - body);
}

// `dst = a + b` over floats with the CRC of `a`, as copy_fold does for a copy: the adds read the
// registers the folding takes (with scalar `crc32` lanes beside it, 0.75-0.85x as fast: the same
// doc). The same IEEE additions as the float sum kernel, which also does
// the tail (`tail`), so results are bit-identical.
template <bool kPrefetch>
RF_FOLD_TARGET std::uint32_t sum_f32_fold(CombineFn tail, std::byte* dst_b, const std::byte* a_b, const std::byte* b_b,
                                          std::size_t bytes) noexcept {
  auto* dst = reinterpret_cast<unsigned char*>(dst_b);
  const auto* a = reinterpret_cast<const unsigned char*>(a_b);
  const auto* b = reinterpret_cast<const unsigned char*>(b_b);
  const std::size_t body = bytes / crcfold::kStreamBytes * crcfold::kStreamBytes;
  const crcfold::Stream s = fold_pieces(body, [&](std::size_t at) RF_FOLD_TARGET {
    if constexpr (kPrefetch) prefetch_ahead(a, at, body);  // not `b`, our own input: no gain, a loss at 1-4 MiB
    const crcfold::Block x = crcfold::load(a + at);
    for (int k = 0; k < 4; ++k) {
      const __m512 f = _mm512_castsi512_ps(x.v[k]), o = _mm512_loadu_ps(b + at + 64 * k);
      _mm512_storeu_ps(dst + at + 64 * k, _mm512_add_ps(f, o));
    }
    return x;
  });
  if (bytes > body) tail(dst + body, a + body, b + body, (bytes - body) / sizeof(float), 2);
  return ~crcfold::finish(s, a + body, bytes - body);
}
#endif

// Whether a pass over `bytes` folds its CRCs with AVX-512: the CPU has it and the pass holds at
// least one stream's 256 bytes. Under that nothing would fold, and the folding path's setup
// cost a small call's checked copy or sum a third of its time (reduce_kernels_bench
// checked/small, docs/protection-cost-small-calls.md "Small passes").
bool folds(std::size_t bytes) noexcept {
#if defined(RINGFENCE_CRC_X86)
  static const bool available = crcfold::available();  // decided once, never changed
  return available && bytes >= crcfold::kStreamBytes;
#else
  (void)bytes;
  return false;
#endif
}

}  // namespace

}  // namespace ringfence::detail

namespace ringfence {

std::uint32_t copy_bytes_crc_stream(void* dst_v, const void* src_v, std::size_t bytes) noexcept {
  return detail::checked_copy(static_cast<std::byte*>(dst_v), static_cast<const std::byte*>(src_v), bytes, true,
                              detail::CheckedSource::Cache);
}

void copy_bytes_stream(void* dst_v, const void* src_v, std::size_t bytes) noexcept {
#if defined(__x86_64__)
  // SSE2 streaming stores exist on every x86-64; a 16-byte store streams as well as a wider one.
  if (bytes >= 256 && reinterpret_cast<std::uintptr_t>(dst_v) % 16 == 0) {
    auto* dst = static_cast<std::byte*>(dst_v);
    const auto* src = static_cast<const std::byte*>(src_v);
    const std::size_t body = bytes / 64 * 64;
    for (std::size_t i = 0; i < body; i += 64)
      for (std::size_t k = 0; k < 64; k += 16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + k)));
    _mm_sfence();
    if (bytes > body) std::memcpy(dst + body, src + body, bytes - body);
    return;
  }
#endif
  copy_bytes(dst_v, src_v, bytes);
}

std::uint32_t copy_bytes_crc(void* dst_v, const void* src_v, std::size_t bytes) noexcept {
  return detail::checked_copy(static_cast<std::byte*>(dst_v), static_cast<const std::byte*>(src_v), bytes, false,
                              detail::CheckedSource::Cache);
}

// Up to a slot, one loop folding the registers it copies (copy_fold), streaming where asked and
// the destination allows. Larger copies fold the source's bytes again from the cache after each
// group of copy_bytes: the CRC says what was meant to be sent, whatever happened to `dst`.
std::uint32_t detail::checked_copy(std::byte* dst, const std::byte* src, std::size_t bytes, bool stream,
                                   CheckedSource from) noexcept {
  std::uint32_t crc = 0;
#if defined(RINGFENCE_CRC_X86)
  if (folds(bytes)) {
    if (bytes <= kFusedMaxBytes) {
      const bool ahead = from == CheckedSource::Memory;
      if (stream && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0)
        return ahead ? copy_fold<true, false, true>(dst, src, bytes) : copy_fold<true>(dst, src, bytes);
      return ahead ? copy_fold<false, false, true>(dst, src, bytes) : copy_fold<false>(dst, src, bytes);
    }
    fold_along([&](std::size_t at, std::size_t n) { copy_bytes(dst + at, src + at, n); }, src, nullptr, bytes, 1, &crc, nullptr);
    return crc;
  }
#endif
  (void)stream, (void)from;
  for (std::size_t at = 0; at < bytes; at += kCheckedBlockBytes) {
    const std::size_t n = std::min(kCheckedBlockBytes, bytes - at);
    copy_bytes(dst + at, src + at, n);
    crc = crc32c(src + at, n, crc);
  }
  return crc;
}

std::uint32_t detail::copy_crc_of_copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
#if defined(RINGFENCE_CRC_X86)
  // Folds the very registers it stores, and the tail from the copy.
  if (detail::folds(bytes) && bytes <= detail::kFusedMaxBytes) return detail::copy_fold<false, true>(dst, src, bytes);
  if (bytes < detail::crcfold::kStreamBytes && detail::copies_masked()) {
    detail::copy_masked_short(reinterpret_cast<unsigned char*>(dst), reinterpret_cast<const unsigned char*>(src), bytes);
    return crc32c(dst, bytes);
  }
#endif
  copy_bytes(dst, src, bytes);
  return crc32c(dst, bytes);
}

std::uint32_t staging_copy_crc(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes > kCopyThenCrcMaxBytes) return copy_bytes_crc(dst, src, bytes);
  copy_bytes(dst, src, bytes);
  return crc32c(src, bytes);
}

std::uint32_t staging_copy_crc_stream(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes > kCopyThenCrcMaxBytes) return copy_bytes_crc_stream(dst, src, bytes);
  copy_bytes_stream(dst, src, bytes);
  return crc32c(src, bytes);
}

namespace {
// Both destinations block by block, the second copy (and the CRC, where `crc`) reading the block
// from the L1 cache after the first brought it there.
void copy2_in_blocks(std::byte* dst, std::byte* also, const std::byte* src, std::size_t bytes, bool stream,
                     std::uint32_t* crc) noexcept {
  for (std::size_t at = 0; at < bytes; at += detail::kCheckedBlockBytes) {
    const std::size_t n = std::min(detail::kCheckedBlockBytes, bytes - at);
    if (stream) copy_bytes_stream(dst + at, src + at, n);
    else copy_bytes(dst + at, src + at, n);
    copy_bytes(also + at, src + at, n);
    if (crc) *crc = crc32c(src + at, n, *crc);
  }
}
}  // namespace

// Past a small copy (which copies first and folds after, as staging_copy_crc does) and up to a
// slot, one loop folding the registers it stores twice.
std::uint32_t staging_copy2_crc(void* dst_v, void* also_v, const void* src_v, std::size_t bytes, bool stream) noexcept {
  auto* dst = static_cast<std::byte*>(dst_v);
  auto* also = static_cast<std::byte*>(also_v);
  const auto* src = static_cast<const std::byte*>(src_v);
#if defined(RINGFENCE_CRC_X86)
  if (bytes > kCopyThenCrcMaxBytes && detail::folds(bytes) && bytes <= detail::kFusedMaxBytes) {
    if (stream && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0)
      return detail::copy_fold<true, false, false, true>(dst, src, bytes, also);
    return detail::copy_fold<false, false, false, true>(dst, src, bytes, also);
  }
#endif
  std::uint32_t crc = 0;
  copy2_in_blocks(dst, also, src, bytes, stream, &crc);
  return crc;
}

void copy_bytes2(void* dst, void* also, const void* src, std::size_t bytes, bool stream) noexcept {
  copy2_in_blocks(static_cast<std::byte*>(dst), static_cast<std::byte*>(also), static_cast<const std::byte*>(src), bytes,
                  stream, nullptr);
}

}  // namespace ringfence

namespace ringfence::detail {

bool sum_f32_with_crc(CombineFn tail, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count,
                      std::uint32_t* crc_a, CheckedSource from) noexcept {
#if defined(RINGFENCE_CRC_X86)
  const std::size_t bytes = count * sizeof(float);
  if (!folds(bytes) || bytes > kFusedMaxBytes) return false;
  *crc_a = from == CheckedSource::Memory ? sum_f32_fold<true>(tail, dst, a, b, bytes) : sum_f32_fold<false>(tail, dst, a, b, bytes);
  return true;
#else
  (void)tail, (void)dst, (void)a, (void)b, (void)count, (void)crc_a, (void)from;
  return false;
#endif
}

void combine_with_crc(const Reducer& r, bool last, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count,
                      int divisor, std::uint32_t* crc_a, std::uint32_t* crc_dst, CheckedSource from) noexcept {
  const CombineFn fn = last ? r.finish : r.combine;
  const std::size_t elem = r.elem_size;
  const bool a_first = dst == a;  // only then must `a` be taken before it is overwritten
  // A float32 sum (avg before its last step) asked for its input's CRC alone: one loop.
  const bool sums_f32 = r.type == DataType::Float32 && (r.op == ReduceOp::Sum || (r.op == ReduceOp::Avg && !last));
  if (sums_f32 && crc_a && !crc_dst && !a_first && sum_f32_with_crc(fn, dst, a, b, count, crc_a, from)) return;
#if defined(RINGFENCE_CRC_X86)
  if (folds(count * elem) && !a_first && (crc_a || crc_dst)) {
    // One or two streams: the first folded is `a` when asked for, else the result.
    const auto pass = [&](std::size_t at, std::size_t n) { fn(dst + at, a + at, b + at, n / elem, divisor); };
    if (crc_a && crc_dst) fold_along(pass, a, dst, count * elem, elem, crc_a, crc_dst);
    else if (crc_a) fold_along(pass, a, nullptr, count * elem, elem, crc_a, nullptr);
    else fold_along(pass, dst, nullptr, count * elem, elem, crc_dst, nullptr);
    return;
  }
#endif
  // The combine streams its operands in; the CRCs then read the block from the cache.
  const std::size_t per_block = std::max<std::size_t>(1, kCheckedBlockBytes / elem);
  std::uint32_t ca = 0, cd = 0;
  for (std::size_t i = 0; i < count; i += per_block) {
    const std::size_t n = std::min(per_block, count - i);
    const std::size_t off = i * elem, bytes = n * elem;
    if (crc_a && a_first) ca = crc32c(a + off, bytes, ca);
    fn(dst + off, a + off, b + off, n, divisor);
    if (crc_a && !a_first) ca = crc32c(a + off, bytes, ca);
    if (crc_dst) cd = crc32c(dst + off, bytes, cd);
  }
  if (crc_a) *crc_a = ca;
  if (crc_dst) *crc_dst = cd;
}

}  // namespace ringfence::detail
