// sysfs source: IB PMA/hw counters and port state, PCIe AER and link training.
#include <ringfence/error.hpp>
#include <ringfence/health/sysfs_source.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace ringfence::health {

namespace fs = std::filesystem;

// Widths from drivers/infiniband/core/sysfs.c (PORT_PMA_ATTR). The IBTA says these saturate.
const IbCounterSpec kIbErrorCounters[8] = {
    {"symbol_error", 16},
    {"link_error_recovery", 8},
    {"link_downed", 8},
    {"port_rcv_errors", 16},
    {"port_rcv_remote_physical_errors", 16},
    {"port_xmit_discards", 16},
    {"local_link_integrity_errors", 4},
    {"excessive_buffer_overrun_errors", 4},
};

int mlx5_hw_counter_width(std::string_view name) noexcept {
  // Congestion-control counters are 64-bit; the Q counters below are 32-bit firmware values.
  if (name.starts_with("rp_") || name.starts_with("np_")) return 64;
  static constexpr std::string_view kQ[] = {"out_of_buffer",
                                            "out_of_sequence",
                                            "duplicate_request",
                                            "packet_seq_err",
                                            "implied_nak_seq_err",
                                            "local_ack_timeout_err",
                                            "rnr_nak_retry_err",
                                            "req_transport_retries_exceeded",
                                            "req_rnr_retries_exceeded",
                                            "req_cqe_error",
                                            "resp_cqe_error",
                                            "req_cqe_flush_error",
                                            "resp_cqe_flush_error",
                                            "req_remote_access_errors",
                                            "resp_remote_access_errors",
                                            "req_remote_invalid_request",
                                            "resp_local_length_error",
                                            "rx_write_requests",
                                            "rx_read_requests",
                                            "rx_atomic_requests",
                                            "rx_dct_connect",
                                            "rx_icrc_encapsulated",
                                            "roce_adp_retrans",
                                            "roce_adp_retrans_to",
                                            "roce_slow_restart",
                                            "roce_slow_restart_cnps",
                                            "roce_slow_restart_trans"};
  for (std::string_view q : kQ)
    if (q == name) return 32;
  return 0;
}

namespace {

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Reads a small sysfs file. POSIX calls rather than iostreams: no exceptions, and one read()
// returns the whole attribute (sysfs attributes are at most a page).
std::optional<std::string> read_small_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return std::nullopt;  // e.g. EIO from a PMA query that failed
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1u << 16)) break;  // not a sysfs attribute; stop reading
  }
  ::close(fd);
  return out;
}

std::optional<double> parse_double(std::string_view s) noexcept {
  // from_chars for double is available in libstdc++ 11+.
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !(v >= 0)) return std::nullopt;
  return v;
}

std::optional<int> parse_int(std::string_view s) noexcept {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

CounterReading read_counter(const fs::path& path, int width_bits, bool saturates) {
  CounterReading r = CounterReading::unknown(width_bits, saturates);
  if (auto text = read_small_file(path)) r.value = parse_counter_text(*text);
  return r;
}

template <class T, class F>
std::optional<T> read_parsed(const fs::path& path, F parse) {
  auto text = read_small_file(path);
  if (!text) return std::nullopt;
  return parse(*text);
}

// Sorted directory entries that are directories (following sysfs symlinks). Throws only when
// `dir` exists but cannot be listed.
std::vector<std::string> list_dirs(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return names;
  fs::directory_iterator it(dir, ec);
  if (ec) throw SystemError("health: cannot list " + dir.string() + ": " + ec.message(), ec.value());
  for (const fs::directory_entry& e : it) {
    std::error_code ec2;
    if (e.is_directory(ec2)) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::optional<std::uint64_t> parse_counter_text(std::string_view text) noexcept {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<int> parse_state_text(std::string_view text) noexcept {
  text = trim(text);
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  return parse_int(trim(text.substr(0, colon)));
}

std::pair<std::optional<double>, std::optional<int>> parse_rate_text(std::string_view text) noexcept {
  text = trim(text);
  std::pair<std::optional<double>, std::optional<int>> out;
  const std::size_t gb = text.find(" Gb/sec");
  if (gb == std::string_view::npos) return out;
  out.first = parse_double(trim(text.substr(0, gb)));
  const std::size_t open = text.find('(', gb);
  const std::size_t x = text.find('X', open == std::string_view::npos ? text.size() : open);
  if (open != std::string_view::npos && x != std::string_view::npos) out.second = parse_int(text.substr(open + 1, x - open - 1));
  return out;
}

std::optional<double> parse_pcie_speed_text(std::string_view text) noexcept {
  text = trim(text);
  const std::size_t gt = text.find(" GT/s");
  if (gt == std::string_view::npos) return std::nullopt;
  auto v = parse_double(trim(text.substr(0, gt)));
  if (v && *v <= 0) return std::nullopt;
  return v;
}

AerCounters parse_aer_text(std::string_view text) {
  AerCounters out;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty()) continue;
    // "<Name with spaces> <count>": the count is the last field.
    const std::size_t sp = line.find_last_of(" \t");
    if (sp == std::string_view::npos) {
      out.emplace_back(std::string(line), CounterReading::unknown(64));
      continue;
    }
    CounterReading r = CounterReading::unknown(64);
    r.value = parse_counter_text(line.substr(sp + 1));
    out.emplace_back(std::string(trim(line.substr(0, sp))), r);
  }
  return out;
}

std::optional<bool> IbPortSample::link_up() const {
  if (!state || !phys_state) return std::nullopt;
  return *state == 4 && *phys_state == 5;
}

CounterReading PcieSample::total(std::string_view which) const {
  const AerCounters* file = which == "correctable" ? &correctable
                            : which == "nonfatal"  ? &nonfatal
                            : which == "fatal"     ? &fatal
                                                   : nullptr;
  const std::string_view key = which == "correctable" ? "TOTAL_ERR_COR"
                               : which == "nonfatal"  ? "TOTAL_ERR_NONFATAL"
                                                      : "TOTAL_ERR_FATAL";
  if (file != nullptr)
    for (const auto& [name, reading] : *file)
      if (name == key) return reading;
  return CounterReading::unknown(64);
}

std::optional<bool> PcieSample::downtrained() const {
  if (!current_speed_gts || !max_speed_gts || !current_width || !max_width) return std::nullopt;
  return *current_speed_gts < *max_speed_gts || *current_width < *max_width;
}

SysfsSource::SysfsSource(std::string root, std::vector<std::string> pci_devices)
    : root_(std::move(root)), pci_devices_(std::move(pci_devices)) {
  std::error_code ec;
  if (!fs::is_directory(root_, ec))
    throw InvalidUsage("health: sysfs root '" + root_ + "' is not a directory");
  const fs::path ib = fs::path(root_) / "sys/class/infiniband";
  for (const std::string& dev : list_dirs(ib))
    for (const std::string& p : list_dirs(ib / dev / "ports"))
      if (auto n = parse_int(p); n && *n > 0) ib_ports_.push_back(IbPort{dev, *n});
  if (pci_devices_.empty()) {
    const fs::path pci = fs::path(root_) / "sys/bus/pci/devices";
    for (const std::string& bdf : list_dirs(pci))
      if (fs::exists(pci / bdf / "aer_dev_correctable", ec)) pci_devices_.push_back(bdf);
  }
  std::sort(ib_ports_.begin(), ib_ports_.end());
  std::sort(pci_devices_.begin(), pci_devices_.end());
}

IbPortSample SysfsSource::sample_ib(const IbPort& port) const {
  IbPortSample s;
  s.port = port;
  const fs::path dir = fs::path(root_) / "sys/class/infiniband" / port.device / "ports" / std::to_string(port.port);
  for (const IbCounterSpec& c : kIbErrorCounters)
    s.counters.emplace_back(std::string(c.name), read_counter(dir / "counters" / c.name, c.width_bits, true));
  // hw_counters is driver specific: take whatever files are there. Listing errors leave it empty.
  std::error_code ec;
  const fs::path hw = dir / "hw_counters";
  std::vector<std::string> names;
  for (fs::directory_iterator it(hw, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const std::string name = it->path().filename().string();
    if (name != "lifespan" && it->is_regular_file(ec2)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names)
    s.hw_counters.emplace_back(name, read_counter(hw / name, mlx5_hw_counter_width(name), false));
  s.state = read_parsed<int>(dir / "state", parse_state_text);
  s.phys_state = read_parsed<int>(dir / "phys_state", parse_state_text);
  if (auto text = read_small_file(dir / "rate")) std::tie(s.rate_gbps, s.rate_width) = parse_rate_text(*text);
  return s;
}

PcieSample SysfsSource::sample_pcie(const std::string& bdf) const {
  PcieSample s;
  s.bdf = bdf;
  const fs::path dir = fs::path(root_) / "sys/bus/pci/devices" / bdf;
  if (auto t = read_small_file(dir / "aer_dev_correctable")) s.correctable = parse_aer_text(*t);
  if (auto t = read_small_file(dir / "aer_dev_nonfatal")) s.nonfatal = parse_aer_text(*t);
  if (auto t = read_small_file(dir / "aer_dev_fatal")) s.fatal = parse_aer_text(*t);
  s.current_speed_gts = read_parsed<double>(dir / "current_link_speed", parse_pcie_speed_text);
  s.max_speed_gts = read_parsed<double>(dir / "max_link_speed", parse_pcie_speed_text);
  auto width = [](std::string_view t) -> std::optional<int> {
    auto v = parse_int(trim(t));
    return v && *v > 0 ? v : std::nullopt;
  };
  s.current_width = read_parsed<int>(dir / "current_link_width", width);
  s.max_width = read_parsed<int>(dir / "max_link_width", width);
  return s;
}

std::vector<CounterSample> SysfsSource::read_counters() const {
  std::vector<CounterSample> out;
  for (const IbPort& p : ib_ports_) {
    IbPortSample s = sample_ib(p);
    for (auto& [name, r] : s.counters) out.push_back({CounterId{"ib", p.device, p.port, name}, r});
    for (auto& [name, r] : s.hw_counters) out.push_back({CounterId{"ib", p.device, p.port, "hw_counters/" + name}, r});
  }
  for (const std::string& bdf : pci_devices_) {
    PcieSample s = sample_pcie(bdf);
    struct File {
      const char* name;
      const char* total;
      const AerCounters* counters;
    };
    const File files[] = {{"aer_dev_correctable", "TOTAL_ERR_COR", &s.correctable},
                          {"aer_dev_nonfatal", "TOTAL_ERR_NONFATAL", &s.nonfatal},
                          {"aer_dev_fatal", "TOTAL_ERR_FATAL", &s.fatal}};
    for (const auto& [file, total, counters] : files) {
      // A missing TOTAL line (or file) is still reported, as unknown, so that the bank tracks
      // it and the policy sees "unknown" rather than "absent".
      bool have_total = false;
      for (const auto& [name, r] : *counters) {
        have_total |= name == std::string_view(total);
        out.push_back({CounterId{"pcie", bdf, 0, std::string(file) + "/" + name}, r});
      }
      if (!have_total) out.push_back({CounterId{"pcie", bdf, 0, std::string(file) + "/" + total}, CounterReading::unknown(64)});
    }
  }
  return out;
}

}  // namespace ringfence::health
