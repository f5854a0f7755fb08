#pragma once
/// \file rank_output.hpp
/// Where `ringfence-run` puts its ranks' output (docs/launching.md, "Output"): each rank's
/// stdout and stderr arrive through pipes and are passed on whole line by whole line, so lines
/// of different ranks never mix inside a line. By default a line goes out as the rank wrote it,
/// as under `mpirun` (parsers written for nccl-tests read it unchanged); `--tag-output` puts
/// `[R] ` in front; `--output-dir DIR` sends rank R's streams to `DIR/rank.R/stdout` and
/// `DIR/rank.R/stderr` instead of the launcher's.
#include <cstddef>
#include <string>
#include <string_view>

namespace ringfence::launcher {

/// Writes all of `data` to `fd`; output errors (closed terminal, full disk) are ignored so a
/// broken log sink never leaves ranks unsupervised.
void write_all(int fd, std::string_view data);

/// One captured stream of one rank.
struct Stream {
  int fd = -1;      ///< read end; -1 once EOF was seen
  int out_fd = 1;   ///< where its lines go
  bool owns_out = false;  ///< `out_fd` is a file of --output-dir (closed with the stream)
  std::string partial;    ///< bytes after the last complete line

  /// Emits every complete line of `partial` with `prefix` in front (and the rest too when
  /// `at_eof`, or when it grew past a line's limit).
  void emit(const std::string& prefix, bool at_eof);
  /// Emits what is left and closes the read end (and the file it wrote to, if owned).
  void finish(const std::string& prefix);
};

/// The prefix of rank `rank`'s lines: `[R] ` with R zero-padded to `width` digits when tagging,
/// else nothing.
std::string line_prefix(bool tag, int rank, std::size_t width);

/// Opens (creating `dir` and `dir/rank.R`, R zero-padded to `width`) rank `rank`'s `stdout` and
/// `stderr` files, truncated. Throws std::runtime_error naming the path that failed.
void open_rank_files(const std::string& dir, int rank, std::size_t width, int& out_fd, int& err_fd);

}  // namespace ringfence::launcher
