// NVML source: dlopen'ed NVML with our own declarations (no nvml.h), everything unknown on failure.
#include <ringfence/health/nvml_source.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstddef>
#include <mutex>

namespace ringfence::health {

namespace {

// --- Our declarations of the NVML ABI (reference health-counters.md §1.2; x86-64/aarch64 LP64) ---
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInvalidArgument = 2;
constexpr NvmlReturn kNvmlNotSupported = 3;
constexpr NvmlReturn kNvmlNotFound = 6;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;  // the header's struct wrapper has the ABI of this pointer

union NvmlValue {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  unsigned short usVal;
};

struct NvmlFieldValue {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t
  NvmlReturn nvmlReturn;
  NvmlValue value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t is 40 bytes");
static_assert(offsetof(NvmlFieldValue, valueType) == 24 && offsetof(NvmlFieldValue, value) == 32);

constexpr int kMemoryErrorCorrected = 0;
constexpr int kMemoryErrorUncorrected = 1;
constexpr int kEccCounterVolatile = 0;

using InitFn = NvmlReturn (*)();
using ShutdownFn = NvmlReturn (*)();
using GetCountFn = NvmlReturn (*)(unsigned int*);
using GetHandleByIndexFn = NvmlReturn (*)(unsigned int, NvmlDevice*);
using GetNvLinkStateFn = NvmlReturn (*)(NvmlDevice, unsigned int, int*);
using GetFieldValuesFn = NvmlReturn (*)(NvmlDevice, int, NvmlFieldValue*);
using GetTotalEccErrorsFn = NvmlReturn (*)(NvmlDevice, int, int, unsigned long long*);
using GetRemappedRowsFn = NvmlReturn (*)(NvmlDevice, unsigned int*, unsigned int*, unsigned int*, unsigned int*);
using GetPcieReplayCounterFn = NvmlReturn (*)(NvmlDevice, unsigned int*);

template <class Fn>
Fn lookup(void* lib, const char* name) {
  // POSIX guarantees that dlsym's object pointer converts to a function pointer.
  return reinterpret_cast<Fn>(::dlsym(lib, name));
}

// One field value as a counter; per-entry nvmlReturn must be checked (the call succeeds when
// any entry was filled).
CounterReading field_reading(const NvmlFieldValue& f) {
  CounterReading r = CounterReading::unknown(64);
  if (f.nvmlReturn != kNvmlSuccess) return r;
  // nvmlValueType_t: DOUBLE 0, UNSIGNED_INT 1, UNSIGNED_LONG 2, UNSIGNED_LONG_LONG 3,
  // SIGNED_LONG_LONG 4, SIGNED_INT 5, UNSIGNED_SHORT 6. Negative values are not counters.
  switch (f.valueType) {
    case 0:
      if (f.value.dVal >= 0) r.value = static_cast<std::uint64_t>(f.value.dVal);
      break;
    case 1:
      r.value = f.value.uiVal;
      r.width_bits = 32;
      break;
    case 2: r.value = f.value.ulVal; break;
    case 3: r.value = f.value.ullVal; break;
    case 4:
      if (f.value.sllVal >= 0) r.value = static_cast<std::uint64_t>(f.value.sllVal);
      break;
    case 5:
      if (f.value.siVal >= 0) r.value = static_cast<std::uint64_t>(f.value.siVal);
      r.width_bits = 32;
      break;
    case 6:
      r.value = f.value.usVal;
      r.width_bits = 16;
      break;
    default: break;
  }
  return r;
}

}  // namespace

struct NvmlSource::Impl {
  void* lib = nullptr;
  bool initialised = false;
  std::string reason;
  unsigned count = 0;
  unsigned max_links = 36;
  InitFn init = nullptr;
  ShutdownFn shutdown = nullptr;
  GetCountFn get_count = nullptr;
  GetHandleByIndexFn get_handle = nullptr;
  GetNvLinkStateFn get_nvlink_state = nullptr;
  GetFieldValuesFn get_field_values = nullptr;
  GetTotalEccErrorsFn get_total_ecc = nullptr;
  GetRemappedRowsFn get_remapped_rows = nullptr;
  GetPcieReplayCounterFn get_pcie_replay = nullptr;
  // NVML is documented thread-safe, but NCCL serialises every call after hitting NVML thread
  // safety bugs; a per-instance mutex does the same without global state.
  mutable std::mutex mu;
};

NvmlSource::NvmlSource(const std::string& library, unsigned max_links) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.max_links = max_links;
  m.lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (m.lib == nullptr) {
    const char* err = ::dlerror();
    m.reason = fmt::format("dlopen({}) failed: {}", library, err != nullptr ? err : "unknown error");
    return;
  }
  // Prefer the versioned exports (what nvml.h #defines the plain names to); fall back to the
  // unversioned ones, which have the same signatures for these functions.
  m.init = lookup<InitFn>(m.lib, "nvmlInit_v2");
  if (m.init == nullptr) m.init = lookup<InitFn>(m.lib, "nvmlInit");
  m.shutdown = lookup<ShutdownFn>(m.lib, "nvmlShutdown");
  m.get_count = lookup<GetCountFn>(m.lib, "nvmlDeviceGetCount_v2");
  if (m.get_count == nullptr) m.get_count = lookup<GetCountFn>(m.lib, "nvmlDeviceGetCount");
  m.get_handle = lookup<GetHandleByIndexFn>(m.lib, "nvmlDeviceGetHandleByIndex_v2");
  if (m.get_handle == nullptr) m.get_handle = lookup<GetHandleByIndexFn>(m.lib, "nvmlDeviceGetHandleByIndex");
  // Optional: a missing one leaves its readings unknown.
  m.get_nvlink_state = lookup<GetNvLinkStateFn>(m.lib, "nvmlDeviceGetNvLinkState");
  m.get_field_values = lookup<GetFieldValuesFn>(m.lib, "nvmlDeviceGetFieldValues");
  m.get_total_ecc = lookup<GetTotalEccErrorsFn>(m.lib, "nvmlDeviceGetTotalEccErrors");
  m.get_remapped_rows = lookup<GetRemappedRowsFn>(m.lib, "nvmlDeviceGetRemappedRows");
  m.get_pcie_replay = lookup<GetPcieReplayCounterFn>(m.lib, "nvmlDeviceGetPcieReplayCounter");
  if (m.init == nullptr || m.shutdown == nullptr || m.get_count == nullptr || m.get_handle == nullptr) {
    m.reason = fmt::format("{} lacks nvmlInit/nvmlShutdown/nvmlDeviceGetCount/nvmlDeviceGetHandleByIndex", library);
    return;
  }
  if (NvmlReturn rc = m.init(); rc != kNvmlSuccess) {
    m.reason = fmt::format("nvmlInit returned {}", rc);
    return;
  }
  m.initialised = true;
  unsigned n = 0;
  if (NvmlReturn rc = m.get_count(&n); rc != kNvmlSuccess) {
    m.reason = fmt::format("nvmlDeviceGetCount returned {}", rc);
    return;
  }
  m.count = n;
}

NvmlSource::~NvmlSource() {
  if (impl_ && impl_->initialised && impl_->shutdown != nullptr) {
    std::lock_guard lock(impl_->mu);
    (void)impl_->shutdown();
  }
}

bool NvmlSource::available() const noexcept { return impl_->initialised && impl_->reason.empty(); }
const std::string& NvmlSource::unavailable_reason() const noexcept { return impl_->reason; }
unsigned NvmlSource::device_count() const noexcept { return available() ? impl_->count : 0; }

NvmlDeviceSample NvmlSource::sample(unsigned index) const {
  NvmlDeviceSample s;
  s.index = index;
  s.ecc_corrected = CounterReading::unknown(64);
  s.ecc_uncorrected = CounterReading::unknown(64);
  s.remapped_correctable = CounterReading::unknown(32);
  s.remapped_uncorrectable = CounterReading::unknown(32);
  s.pcie_replay = CounterReading::unknown(32);
  if (!available() || index >= impl_->count) return s;
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  NvmlDevice dev = nullptr;
  if (m.get_handle(index, &dev) != kNvmlSuccess) return s;

  if (m.get_nvlink_state != nullptr) {
    for (unsigned link = 0; link < m.max_links; ++link) {
      int state = 0;
      // INVALID_ARGUMENT past the last link, NOT_SUPPORTED without NVLink: either way the link
      // does not exist for us. Other errors (GPU lost) keep the link with an unknown state.
      const NvmlReturn rc = m.get_nvlink_state(dev, link, &state);
      if (rc == kNvmlInvalidArgument || rc == kNvmlNotSupported || rc == kNvmlNotFound) continue;
      NvLinkSample l;
      l.link = link;
      if (rc == kNvmlSuccess) l.active = state == 1;
      l.crc_flit = l.crc_data = l.replay = l.recovery = CounterReading::unknown(64);
      if (m.get_field_values != nullptr) {
        NvmlFieldValue f[4] = {};
        const NvmlField ids[4] = {NvmlField::NvlinkCrcFlitTotal, NvmlField::NvlinkCrcDataTotal,
                                  NvmlField::NvlinkReplayTotal, NvmlField::NvlinkRecoveryTotal};
        for (int i = 0; i < 4; ++i) {
          f[i].fieldId = static_cast<unsigned>(ids[i]);
          f[i].scopeId = link;
          f[i].nvmlReturn = kNvmlNotSupported;  // stays "not supported" if NVML leaves an entry untouched
        }
        if (m.get_field_values(dev, 4, f) == kNvmlSuccess) {
          l.crc_flit = field_reading(f[0]);
          l.crc_data = field_reading(f[1]);
          l.replay = field_reading(f[2]);
          l.recovery = field_reading(f[3]);
        }
      }
      s.links.push_back(l);
    }
  }
  if (m.get_total_ecc != nullptr) {
    unsigned long long v = 0;
    if (m.get_total_ecc(dev, kMemoryErrorCorrected, kEccCounterVolatile, &v) == kNvmlSuccess) s.ecc_corrected.value = v;
    if (m.get_total_ecc(dev, kMemoryErrorUncorrected, kEccCounterVolatile, &v) == kNvmlSuccess)
      s.ecc_uncorrected.value = v;
  }
  if (m.get_remapped_rows != nullptr) {
    unsigned corr = 0, unc = 0, pending = 0, failure = 0;
    if (m.get_remapped_rows(dev, &corr, &unc, &pending, &failure) == kNvmlSuccess) {
      s.remapped_correctable.value = corr;
      s.remapped_uncorrectable.value = unc;
      s.remap_pending = pending != 0;
      s.remap_failure = failure != 0;
    }
  }
  if (m.get_pcie_replay != nullptr) {
    unsigned v = 0;
    if (m.get_pcie_replay(dev, &v) == kNvmlSuccess) s.pcie_replay.value = v;
  }
  return s;
}

std::vector<CounterSample> NvmlSource::read_counters() const {
  std::vector<CounterSample> out;
  for (unsigned i = 0; i < device_count(); ++i) {
    const NvmlDeviceSample s = sample(i);
    const std::string dev = std::to_string(i);
    for (const NvLinkSample& l : s.links) {
      const int port = static_cast<int>(l.link);
      out.push_back({CounterId{"nvml", dev, port, "nvlink_crc_flit"}, l.crc_flit});
      out.push_back({CounterId{"nvml", dev, port, "nvlink_crc_data"}, l.crc_data});
      out.push_back({CounterId{"nvml", dev, port, "nvlink_replay"}, l.replay});
      out.push_back({CounterId{"nvml", dev, port, "nvlink_recovery"}, l.recovery});
    }
    out.push_back({CounterId{"nvml", dev, 0, "ecc_corrected"}, s.ecc_corrected});
    out.push_back({CounterId{"nvml", dev, 0, "ecc_uncorrected"}, s.ecc_uncorrected});
    out.push_back({CounterId{"nvml", dev, 0, "remapped_correctable"}, s.remapped_correctable});
    out.push_back({CounterId{"nvml", dev, 0, "remapped_uncorrectable"}, s.remapped_uncorrectable});
    out.push_back({CounterId{"nvml", dev, 0, "pcie_replay"}, s.pcie_replay});
  }
  return out;
}

}  // namespace ringfence::health
