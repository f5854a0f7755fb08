// Who owns a shared-memory segment, and removing those whose owner is gone.
//
// A segment's creator holds an exclusive `flock` on it for the segment's whole life (the
// descriptor stays open; see create_owned_segment). The kernel drops that lock when the process
// dies, however it dies and in whatever PID namespace it lives, so "can I take the lock?" is a
// liveness test that a pid (meaningless across namespaces, reusable after exit) is not. A sweep
// that takes the lock unlinks the segment. A creator is between shm_open and flock for an
// instant; a sweep that unlinks its segment then is noticed (the name's link count is 0 once the
// creator holds the lock) and the creator starts over under a new name.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transports/shm.hpp>
#include <string>
#include <string_view>

namespace ringfence::transports::shm {
namespace {

constexpr std::string_view kPrefix = "rf-";  // /dev/shm/rf-<pid>-<nonce>-<n>

// Unlinks /dev/shm/<name> when its owner's lock is free. True when it was removed.
bool remove_if_unowned(const std::string& name) noexcept {
  const std::string path = "/" + name;
  const int fd = ::shm_open(path.c_str(), O_RDONLY | O_NOFOLLOW, 0);
  if (fd < 0) return false;  // gone already, or not ours to open (another user's)
  bool removed = false;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    removed = ::shm_unlink(path.c_str()) == 0;
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return removed;
}

}  // namespace

int create_owned_segment(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return -1;
  int err = 0;
  while (::flock(fd, LOCK_EX) != 0)  // blocking: a sweep holds it for an instant at most
    if (errno != EINTR) {
      err = errno;
      break;
    }
  struct stat st {};
  if (err == 0 && ::fstat(fd, &st) != 0) err = errno;
  if (err == 0 && st.st_nlink == 0) err = EAGAIN;  // a sweep took it for stale before we locked it
  if (err != 0) {
    ::close(fd);
    if (err != EAGAIN) ::shm_unlink(name.c_str());
    errno = err;
    return -1;
  }
  return fd;
}

std::size_t remove_stale_segments(const Logger* log) noexcept {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name(e->d_name);
    if (!name.starts_with(kPrefix)) continue;
    if (remove_if_unowned(name)) {
      ++removed;
      if (log) log->debug("shm: removed stale segment /{} (its owner is gone)", name);
    }
  }
  ::closedir(dir);
  return removed;
}

}  // namespace ringfence::transports::shm
