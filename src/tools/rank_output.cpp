// Passing ranks' output on for ringfence-run (rank_output.hpp).
#include "rank_output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ringfence::launcher {
namespace {

// A line longer than this is printed in pieces rather than buffered without bound.
constexpr std::size_t kMaxLineBytes = 64u << 10;

std::string padded(int rank, std::size_t width) {
  const std::string r = std::to_string(rank);
  return std::string(width > r.size() ? width - r.size() : 0, '0') + r;
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw std::runtime_error("--output-dir: cannot create " + path + ": " + std::strerror(errno));
}

// mkdir -p: every missing component of `path`.
void make_dirs(const std::string& path) {
  for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) make_dir(path.substr(0, at));
  make_dir(path);
}

int open_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("--output-dir: cannot open " + path + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void Stream::emit(const std::string& prefix, bool at_eof) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = partial.find('\n', start);
    if (nl == std::string::npos) break;
    out.append(prefix).append(partial, start, nl + 1 - start);
    start = nl + 1;
  }
  partial.erase(0, start);
  if (!partial.empty() && (at_eof || partial.size() >= kMaxLineBytes)) {
    out.append(prefix).append(partial).push_back('\n');
    partial.clear();
  }
  write_all(out_fd, out);
}

void Stream::finish(const std::string& prefix) {
  emit(prefix, true);
  if (fd >= 0) ::close(fd);
  fd = -1;
  if (owns_out) ::close(out_fd);
  owns_out = false;
}

std::string line_prefix(bool tag, int rank, std::size_t width) { return tag ? "[" + padded(rank, width) + "] " : std::string(); }

void open_rank_files(const std::string& dir, int rank, std::size_t width, int& out_fd, int& err_fd) {
  const std::string rank_dir = (dir.size() > 1 && dir.back() == '/' ? dir.substr(0, dir.size() - 1) : dir) + "/rank." + padded(rank, width);
  make_dirs(rank_dir);
  out_fd = open_file(rank_dir + "/stdout");
  try {
    err_fd = open_file(rank_dir + "/stderr");
  } catch (...) {
    ::close(out_fd);
    throw;
  }
}

}  // namespace ringfence::launcher
