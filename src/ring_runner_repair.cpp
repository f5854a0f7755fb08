// RingRunner, repair of chunks that a damaged link never delivers whole (issue #26): with a
// flip rate of 1e-4 per byte a 256 KiB chunk carries some 26 flipped bits per delivery and
// essentially never arrives intact, however often it is re-sent. The receiver keeps what it has
// and asks for the chunk piece by piece instead, each piece with its own CRC in the trailer,
// halving the piece while pieces keep failing and growing it back while they get through; the
// size that worked is where the link's next chunk starts. Every failed piece counts as a
// checksum error, so the health layer sees the link's state and fences it at the next agreement.
#include "ring_runner.hpp"

namespace ringfence::detail {

namespace {
// Deliveries of one piece that may fail before the piece is halved.
constexpr int kPieceTries = 6;
}  // namespace

Status RingRunner::repair_in_pieces(Connection& ch, const std::byte* data, std::size_t bytes) noexcept {
  const std::uint64_t m = ch.received;
  std::size_t piece = ch.repair_piece ? ch.repair_piece : std::min(kLargestPiece, bytes / 2);
  piece = std::max(kPieceUnit, piece / kPieceUnit * kPieceUnit);
  for (std::size_t first = 0; first < bytes;) {
    const std::size_t end = std::min(bytes, first + piece);
    int tries = 0;
    for (;;) {
      RINGFENCE_TRY(request_resend(ch, m, encode_piece(first, end)));
      RINGFENCE_TRY(wait_flag(ch, flags_.retry[ch.peer], ch.nacks_sent, "a re-sent piece of a chunk", m));
      const ChunkTrailer t = trailer_of(ch, m);
      if (t.message == static_cast<std::uint32_t>(m) && t.bytes == end - first && t.crc == crc32c(data + first, end - first)) break;
      ++ch.checksum_errors;
      if (++tries >= c_.max_attempts)  // only a piece of the smallest size gets this far
        return fail(Status(ErrorCode::Transient), ch, "an intact chunk (one of its smallest pieces kept failing its checksum)", m);
      if (tries >= kPieceTries && end - first > kPieceUnit) break;  // halve below
    }
    if (tries >= kPieceTries && end - first > kPieceUnit) {
      piece = std::max(kPieceUnit, piece / 2 / kPieceUnit * kPieceUnit);
      continue;  // the same `first`, a smaller piece
    }
    if (tries == 0 && piece < kLargestPiece) piece *= 2;  // got through at once: try larger
    first = end;
  }
  ch.repair_piece = piece;
  return Status::ok();
}

// Writes bytes [p.first, p.end) of message m and a trailer for just those bytes (their CRC
// from the link's copy where it makes one, else from the source).
Status RingRunner::put_piece(Connection& ch, std::uint64_t m, PieceRange p, std::size_t slot) noexcept {
  const Connection::SentChunk& c = ch.sent_log[m % kSentLog];
  const std::size_t len = p.end - p.first;
  WriteOp w = c.dst ? WriteOp{c.src + p.first, nullptr, c.dst, c.dst_offset + p.first, len, m}
                    : WriteOp{c.src + p.first, nullptr, &ch.peer_inbox, slot + c_.data_offset(c.bytes) + p.first, len, m};
  WriteCrc crc;
  w.crc = &crc;
  RINGFENCE_TRY(write_data(ch, w, "writing a piece of a chunk", m));
  return put_trailer(ch, m, crc.done ? crc.value : crc32c(c.src + p.first, len), len);
}

}  // namespace ringfence::detail
