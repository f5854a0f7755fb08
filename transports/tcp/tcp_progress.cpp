// The tcp transport's progress thread: starting and stopping it, its epoll loop over every
// link's sockets, adding and removing links, and the lingering close of their sockets.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <ringfence/error.hpp>
#include <thread>
#include <vector>

#include "tcp_transport.hpp"

namespace ringfence::transports::tcp::detail {

void TcpTransport::add_link(TcpLink* link) {
  std::lock_guard lock(links_mutex_);
  if (!thread_.joinable()) start();
  links_.push_back(link);
  for (std::size_t s = 0; s < link->fds().size(); ++s)
    if (!watch_socket(*link, s))
      throw SystemError(fmt::format("rank {}: tcp: epoll_ctl failed: {}", self_.rank, std::strerror(errno)), errno);
}

void TcpTransport::remove_link(TcpLink* link) noexcept {
  std::lock_guard lock(links_mutex_);
  for (int fd : link->fds()) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  links_.erase(std::remove(links_.begin(), links_.end(), link), links_.end());
}

// A closing link's sockets: our last bytes may still sit in the peer's receive queue, and a
// close() while data arrives makes the kernel answer with a reset, which throws those bytes
// away at the peer. So: send FIN now, and keep reading (discarding) until the peer closes too
// or the linger deadline passes when the transport goes (see ~TcpTransport).
// `abandoned`: the link's communicator failed (its peer may be dead or stopped and never
// close): linger only kShortLinger, so destroying a failed communicator does not wait on it.
// `same_process`: the peer is a rank of this process, whose program may close it only after
// this transport is gone (ncclCommInitAll, then ncclCommDestroy of each in a loop): waiting for
// its FIN would hold every destroy for kLinger. Those sockets linger on a thread of their own
// instead; should the process end first, the peer ends with it.
void TcpTransport::linger(const std::vector<int>& fds, bool abandoned, bool same_process) noexcept {
  std::lock_guard lock(linger_mutex_);
  for (int fd : fds) {
    (void)::shutdown(fd, SHUT_WR);
    lingering_.push_back(Lingering{fd, abandoned, same_process});
  }
}

void TcpTransport::start() {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_ < 0 || wake_ < 0) throw SystemError(fmt::format("rank {}: tcp: epoll/eventfd failed: {}", self_.rank, std::strerror(errno)), errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  thread_ = std::thread([this] { progress(); });
}

// Reads and discards until every lingering socket saw the peer's FIN (or an error), at most
// kLinger; then closes them.
void TcpTransport::close_lingering() noexcept {
  std::vector<Lingering> here, background;
  {
    std::lock_guard lock(linger_mutex_);
    for (const Lingering& l : lingering_) (l.same_process ? background : here).push_back(l);
    lingering_.clear();
  }
  if (!background.empty()) {
    try {
      std::thread([sockets = std::move(background)]() mutable { linger_then_close(std::move(sockets)); }).detach();
    } catch (...) {  // no thread: linger here after all
      here.insert(here.end(), background.begin(), background.end());
    }
  }
  linger_then_close(std::move(here));
}

void TcpTransport::linger_then_close(std::vector<Lingering> sockets) noexcept {
  const auto start = std::chrono::steady_clock::now();
  std::vector<pollfd> open;
  std::vector<bool> abandoned;
  for (const Lingering& l : sockets) open.push_back(pollfd{l.fd, POLLIN, 0}), abandoned.push_back(l.abandoned);
  char sink[65536];
  while (!open.empty() && std::chrono::steady_clock::now() < start + kLinger) {
    (void)::poll(open.data(), open.size(), 50);
    const bool short_over = std::chrono::steady_clock::now() >= start + kShortLinger;
    for (std::size_t i = 0; i < open.size();) {
      ssize_t n = 1;
      while (n > 0) n = ::recv(open[i].fd, sink, sizeof sink, MSG_DONTWAIT);
      const bool done = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || (abandoned[i] && short_over);
      if (done) {
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
        abandoned.erase(abandoned.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (const Lingering& l : sockets) ::close(l.fd);
}

void TcpTransport::stop() noexcept {
  if (thread_.joinable()) {
    stopping_.store(true, std::memory_order_release);
    wake_progress();
    thread_.join();
  }
  if (epoll_ >= 0) ::close(epoll_);
  if (wake_ >= 0) ::close(wake_);
  epoll_ = wake_ = -1;
}

void TcpTransport::progress() noexcept {
  epoll_event events[64];
  constexpr int kKeepIdleMs = static_cast<int>(std::chrono::milliseconds(kKeepIdle).count());
  bool looking = false;  // some link is kept: wake up to take it back once idle
  // stop() sets the flag before it writes the wake-up counter, so once the thread read the
  // counter (whoever's write it took) the flag is seen here.
  while (!stopping_.load(std::memory_order_acquire)) {
    const int n = ::epoll_wait(epoll_, events, 64, looking ? kKeepIdleMs : -1);
    if (n < 0 && errno != EINTR) return;
    std::lock_guard lock(links_mutex_);  // links stay alive while we use them
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {  // stop, or a link was kept (wait_reading)
        std::uint64_t count;
        (void)!::read(wake_, &count, sizeof count);
        continue;
      }
      auto* link = reinterpret_cast<TcpLink*>(static_cast<std::uintptr_t>(events[i].data.u64 >> 3));
      const auto s = static_cast<std::size_t>(events[i].data.u64 & 7);
      if (std::find(links_.begin(), links_.end(), link) == links_.end()) continue;  // removed meanwhile
      std::unique_lock rx(link->rx_mutex, std::try_to_lock);
      if (!rx.owns_lock()) continue;  // its waiting thread reads it (and took it out of the epoll set)
      drain_socket(*link, s);
    }
    looking = take_back_idle();
  }
}

}  // namespace ringfence::transports::tcp::detail
