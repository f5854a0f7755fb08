// NVML source: dlopen'ed NVML with our own declarations (no nvml.h), everything unknown on failure.
#include <ringfence/health/nvml_source.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>

namespace ringfence::health {

namespace {

// --- Our declarations of the NVML ABI (reference health-counters.md §1.2; x86-64/aarch64 LP64) ---
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInvalidArgument = 2;
constexpr NvmlReturn kNvmlNotSupported = 3;
constexpr NvmlReturn kNvmlNotFound = 6;
constexpr NvmlReturn kNvmlTimeout = 10;
constexpr NvmlReturn kNvmlUnknown = 999;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;  // the header's struct wrapper has the ABI of this pointer
struct NvmlEventSetSt;
using NvmlEventSet = NvmlEventSetSt*;  // likewise a single pointer

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

// nvmlPciInfo_t as the versioned symbols (_v2/_v3) fill it. The unversioned symbols use the
// legacy 52-byte layout, which shares the first 36 bytes (a 16-byte bus id, domain, bus,
// device); a buffer of this size is safe with either (reference §1.2).
struct NvmlPciInfo {
  char busIdLegacy[16];  // "%04X:%02X:%02X.0" (the legacy layout's busId)
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // "%08X:%02X:%02X.0"; not present in the legacy layout
};
static_assert(sizeof(NvmlPciInfo) == 68, "nvmlPciInfo_t (v2/v3 layout) is 68 bytes");
static_assert(offsetof(NvmlPciInfo, busId) == 36);

// nvmlEventData_t as nvmlEventSetWait_v2 fills it; the unversioned nvmlEventSetWait fills the
// first three members only (reference §1.2).
struct NvmlEventData {
  NvmlDevice device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid for Xid events (999 = unknown Xid)
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(NvmlEventData) == 32, "nvmlEventData_t is 32 bytes");
static_assert(offsetof(NvmlEventData, eventData) == 16);

// Events drained per poll at most, so a storm cannot keep a sampler in the drain loop; the
// rest stay queued in NVML for the next poll.
constexpr int kMaxEventsPerDrain = 4096;

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
using EventSetCreateFn = NvmlReturn (*)(NvmlEventSet*);
using GetSupportedEventTypesFn = NvmlReturn (*)(NvmlDevice, unsigned long long*);
using RegisterEventsFn = NvmlReturn (*)(NvmlDevice, unsigned long long, NvmlEventSet);
using EventSetWaitFn = NvmlReturn (*)(NvmlEventSet, NvmlEventData*, unsigned int);
using EventSetFreeFn = NvmlReturn (*)(NvmlEventSet);
using GetPciInfoFn = NvmlReturn (*)(NvmlDevice, NvmlPciInfo*);
using GetNvLinkRemotePciInfoFn = NvmlReturn (*)(NvmlDevice, unsigned int, NvmlPciInfo*);
// nvmlIntNvLinkDeviceType_t (an int-sized enum): GPU 0, IBMNPU 1, SWITCH 2, UNKNOWN 0xFF.
using GetNvLinkRemoteDeviceTypeFn = NvmlReturn (*)(NvmlDevice, unsigned int, int*);
constexpr int kNvLinkTypeGpu = 0;
constexpr int kNvLinkTypeIbmNpu = 1;
constexpr int kNvLinkTypeSwitch = 2;

template <class Fn>
Fn lookup(void* lib, const char* name) {
  // POSIX guarantees that dlsym's object pointer converts to a function pointer.
  return reinterpret_cast<Fn>(::dlsym(lib, name));
}

// The canonical bus id in `info`: the 32-byte id of the current layout first, then the
// 16-byte legacy id (the only one a legacy-layout symbol fills). nullopt when neither is a
// printable bus id (e.g. the zeroed struct of an unconnected link).
std::optional<std::string> bus_id_of(const NvmlPciInfo& info, bool legacy_layout) {
  if (!legacy_layout)
    if (auto id = normalize_pci_bus_id(std::string_view(info.busId, ::strnlen(info.busId, sizeof info.busId))))
      return id;
  return normalize_pci_bus_id(std::string_view(info.busIdLegacy, ::strnlen(info.busIdLegacy, sizeof info.busIdLegacy)));
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

XidSeverity classify_xid(unsigned long long xid) noexcept {
  switch (xid) {
    // DCGM "devastating" Xids (always on) and MonitorMem's 64.
    case 48:   // double-bit ECC error
    case 64:   // ECC page retirement / row remap failure
    case 74:   // NVLink error
    case 79:   // GPU has fallen off the bus
    case 95:   // uncontained ECC error
    case 119:  // GSP RPC timeout
    case 120:  // GSP error
    case 140:  // ECC unrecovered error
      return XidSeverity::Fail;
    case 38:   // PCIe: driver firmware / bus error
    case 39:   // PCIe: fabric error
    case 42:   // PCIe: replay
    case 67:   // NVLink
    case 73:   // NVLink
    case 121:  // C2C link corrected error
    case 137:  // NVLink
    case 31:   // memory page fault
    case 32:   // invalid or corrupted push buffer stream
    case 43:   // GPU stopped processing
    case 63:   // ECC page retirement / row remap recording
    case 94:   // contained ECC error
      return XidSeverity::Warn;
    default: return XidSeverity::Ignore;
  }
}

std::string_view to_string(XidSeverity s) noexcept {
  switch (s) {
    case XidSeverity::Ignore: return "ignore";
    case XidSeverity::Warn: return "warn";
    case XidSeverity::Fail: return "fail";
  }
  return "?";
}

struct NvmlSource::Impl {
  // Xid state of one GPU.
  struct Xid {
    NvmlDevice handle = nullptr;  // to attribute events (they name the device by handle)
    bool registered = false;      // XidCriticalError registered on this GPU
    std::uint64_t fatal = 0, warn = 0;
    std::optional<unsigned long long> last_fatal, last_warn;
  };

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
  EventSetCreateFn event_set_create = nullptr;
  GetSupportedEventTypesFn get_supported_events = nullptr;  // optional: without it, just try to register
  RegisterEventsFn register_events = nullptr;
  EventSetWaitFn event_set_wait = nullptr;
  EventSetFreeFn event_set_free = nullptr;
  GetPciInfoFn get_pci_info = nullptr;
  bool pci_info_legacy = false;  // get_pci_info is the unversioned (legacy-layout) symbol
  GetNvLinkRemotePciInfoFn get_remote_pci = nullptr;
  bool remote_pci_legacy = false;  // likewise
  GetNvLinkRemoteDeviceTypeFn get_remote_type = nullptr;  // optional: without it far ends are Unknown
  NvmlEventSet event_set = nullptr;  // null: no GPU has Xid events registered
  std::vector<Xid> xid;              // per GPU, sized device count when the event set exists
  bool drain_ok = true;              // the latest drain did not fail (else Xid counts read unknown)
  // NVML is documented thread-safe, but NCCL serialises every call after hitting NVML thread
  // safety bugs; a per-instance mutex does the same without global state.
  mutable std::mutex mu;

  bool available() const noexcept { return initialised && reason.empty(); }
  // Creates the event set and registers Xid events on every GPU that supports them.
  void register_xid_events();
  // Drains pending events into the Xid counts (and `out` when not null). Caller holds `mu`.
  void drain_xid_events(std::vector<XidEvent>* out);
  // Reads GPU `index` without draining. Caller holds `mu` (or the source is unavailable).
  NvmlDeviceSample sample_locked(unsigned index) const;
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
  m.event_set_create = lookup<EventSetCreateFn>(m.lib, "nvmlEventSetCreate");
  m.get_supported_events = lookup<GetSupportedEventTypesFn>(m.lib, "nvmlDeviceGetSupportedEventTypes");
  m.register_events = lookup<RegisterEventsFn>(m.lib, "nvmlDeviceRegisterEvents");
  m.event_set_wait = lookup<EventSetWaitFn>(m.lib, "nvmlEventSetWait_v2");
  // The unversioned wait fills the first 24 bytes of the same struct (no MIG ids).
  if (m.event_set_wait == nullptr) m.event_set_wait = lookup<EventSetWaitFn>(m.lib, "nvmlEventSetWait");
  m.event_set_free = lookup<EventSetFreeFn>(m.lib, "nvmlEventSetFree");
  // Versioned PCI-info symbols fill the current layout; the unversioned ones the legacy one.
  m.get_pci_info = lookup<GetPciInfoFn>(m.lib, "nvmlDeviceGetPciInfo_v3");
  if (m.get_pci_info == nullptr) m.get_pci_info = lookup<GetPciInfoFn>(m.lib, "nvmlDeviceGetPciInfo_v2");
  if (m.get_pci_info == nullptr) {
    m.get_pci_info = lookup<GetPciInfoFn>(m.lib, "nvmlDeviceGetPciInfo");
    m.pci_info_legacy = true;
  }
  m.get_remote_pci = lookup<GetNvLinkRemotePciInfoFn>(m.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (m.get_remote_pci == nullptr) {
    m.get_remote_pci = lookup<GetNvLinkRemotePciInfoFn>(m.lib, "nvmlDeviceGetNvLinkRemotePciInfo");
    m.remote_pci_legacy = true;
  }
  m.get_remote_type = lookup<GetNvLinkRemoteDeviceTypeFn>(m.lib, "nvmlDeviceGetNvLinkRemoteDeviceType");
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
  m.register_xid_events();
}

void NvmlSource::Impl::register_xid_events() {
  Impl& m = *this;
  if (m.event_set_create == nullptr || m.register_events == nullptr || m.event_set_wait == nullptr ||
      m.event_set_free == nullptr)
    return;  // Xid counts stay unknown
  NvmlEventSet set = nullptr;
  if (m.event_set_create(&set) != kNvmlSuccess || set == nullptr) return;
  std::vector<Impl::Xid> xid(m.count);
  bool any = false;
  for (unsigned i = 0; i < m.count; ++i) {
    if (m.get_handle(i, &xid[i].handle) != kNvmlSuccess) continue;
    if (m.get_supported_events != nullptr) {
      unsigned long long types = 0;
      if (m.get_supported_events(xid[i].handle, &types) != kNvmlSuccess ||
          (types & kNvmlEventTypeXidCriticalError) == 0)
        continue;
    }
    const NvmlReturn rc = m.register_events(xid[i].handle, kNvmlEventTypeXidCriticalError, set);
    if (rc == kNvmlSuccess) {
      xid[i].registered = any = true;
    } else if (rc == kNvmlUnknown) {
      any = false;  // NVML: after an unknown error the set must be freed
      break;
    }
    // NOT_SUPPORTED and other per-device errors leave the set usable: this GPU stays unknown.
  }
  if (!any) {
    (void)m.event_set_free(set);
    return;
  }
  m.event_set = set;
  m.xid = std::move(xid);
}

NvmlSource::~NvmlSource() {
  if (impl_ && impl_->initialised && impl_->shutdown != nullptr) {
    std::lock_guard lock(impl_->mu);
    if (impl_->event_set != nullptr) (void)impl_->event_set_free(impl_->event_set);
    (void)impl_->shutdown();
  }
}

bool NvmlSource::available() const noexcept { return impl_->initialised && impl_->reason.empty(); }
const std::string& NvmlSource::unavailable_reason() const noexcept { return impl_->reason; }
unsigned NvmlSource::device_count() const noexcept { return available() ? impl_->count : 0; }

bool NvmlSource::xid_events_registered(unsigned index) const noexcept {
  // Registration is settled in the constructor: no lock needed.
  return impl_->event_set != nullptr && index < impl_->xid.size() && impl_->xid[index].registered;
}

void NvmlSource::Impl::drain_xid_events(std::vector<XidEvent>* out) {
  Impl& m = *this;
  if (m.event_set == nullptr) return;
  m.drain_ok = true;
  for (int n = 0; n < kMaxEventsPerDrain; ++n) {
    NvmlEventData d{};
    const NvmlReturn rc = m.event_set_wait(m.event_set, &d, 0);  // 0 ms: never blocks
    if (rc == kNvmlTimeout) return;                               // nothing (more) pending
    if (rc != kNvmlSuccess) {
      // GPU lost or another failure: events may have been missed, so this read's Xid counts
      // are unknown (the bank keeps its baseline and the next good read covers the gap).
      m.drain_ok = false;
      return;
    }
    if ((d.eventType & kNvmlEventTypeXidCriticalError) == 0) continue;
    XidEvent ev;
    ev.xid = d.eventData;
    ev.severity = classify_xid(d.eventData);
    const auto it = std::find_if(m.xid.begin(), m.xid.end(),
                                 [&](const Impl::Xid& x) { return x.registered && x.handle == d.device; });
    if (it != m.xid.end()) {
      ev.gpu = static_cast<unsigned>(it - m.xid.begin());
      if (ev.severity == XidSeverity::Fail) {
        ++it->fatal;
        it->last_fatal = ev.xid;
      } else if (ev.severity == XidSeverity::Warn) {
        ++it->warn;
        it->last_warn = ev.xid;
      }
    }
    if (out != nullptr) out->push_back(ev);
  }
}

std::vector<XidEvent> NvmlSource::poll_xid_events() const {
  std::vector<XidEvent> out;
  if (!available()) return out;
  std::lock_guard lock(impl_->mu);
  impl_->drain_xid_events(&out);
  return out;
}

std::optional<std::string> NvmlSource::pci_bus_id(unsigned index) const {
  if (!available() || index >= impl_->count || impl_->get_pci_info == nullptr) return std::nullopt;
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  NvmlDevice dev = nullptr;
  if (m.get_handle(index, &dev) != kNvmlSuccess) return std::nullopt;
  NvmlPciInfo info{};
  if (m.get_pci_info(dev, &info) != kNvmlSuccess) return std::nullopt;
  return bus_id_of(info, m.pci_info_legacy);
}

std::optional<unsigned> NvmlSource::index_of_bus_id(std::string_view bus_id) const {
  const std::optional<std::string> want = normalize_pci_bus_id(bus_id);
  if (!want) return std::nullopt;
  for (unsigned i = 0; i < device_count(); ++i)
    if (pci_bus_id(i) == want) return i;
  return std::nullopt;
}

std::vector<NvLinkPeer> NvmlSource::nvlink_peers(unsigned index) const {
  std::vector<NvLinkPeer> out;
  if (!available() || index >= impl_->count || impl_->get_nvlink_state == nullptr || impl_->get_remote_pci == nullptr)
    return out;
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  NvmlDevice dev = nullptr;
  if (m.get_handle(index, &dev) != kNvmlSuccess) return out;
  for (unsigned link = 0; link < m.max_links; ++link) {
    int state = 0;
    if (m.get_nvlink_state(dev, link, &state) != kNvmlSuccess || state != 1) continue;
    NvLinkFarEnd far_end = NvLinkFarEnd::Unknown;
    if (int type = -1; m.get_remote_type != nullptr && m.get_remote_type(dev, link, &type) == kNvmlSuccess)
      far_end = type == kNvLinkTypeGpu      ? NvLinkFarEnd::Gpu
                : type == kNvLinkTypeSwitch ? NvLinkFarEnd::Switch
                : type == kNvLinkTypeIbmNpu ? NvLinkFarEnd::Cpu
                                            : NvLinkFarEnd::Unknown;
    NvmlPciInfo info{};
    std::optional<std::string> id;
    if (m.get_remote_pci(dev, link, &info) == kNvmlSuccess) id = bus_id_of(info, m.remote_pci_legacy);
    // A switch counts without a readable bus id (some platforms leave it empty); anything else
    // must name its far end.
    if (id || far_end == NvLinkFarEnd::Switch) out.push_back({link, id ? std::move(*id) : std::string(), far_end});
  }
  return out;
}

NvmlDeviceSample NvmlSource::sample(unsigned index) const {
  if (!available() || index >= impl_->count) return impl_->sample_locked(index);  // all unknown; no NVML call
  std::lock_guard lock(impl_->mu);
  impl_->drain_xid_events(nullptr);
  return impl_->sample_locked(index);
}

NvmlDeviceSample NvmlSource::Impl::sample_locked(unsigned index) const {
  NvmlDeviceSample s;
  s.index = index;
  s.ecc_corrected = CounterReading::unknown(64);
  s.ecc_uncorrected = CounterReading::unknown(64);
  s.remapped_correctable = CounterReading::unknown(32);
  s.remapped_uncorrectable = CounterReading::unknown(32);
  s.pcie_replay = CounterReading::unknown(32);
  s.xid_fatal = CounterReading::unknown(64);
  s.xid_warn = CounterReading::unknown(64);
  if (!available() || index >= count) return s;
  const Impl& m = *this;
  if (m.event_set != nullptr && index < m.xid.size() && m.xid[index].registered) {
    const Impl::Xid& x = m.xid[index];
    if (m.drain_ok) {
      s.xid_fatal.value = x.fatal;
      s.xid_warn.value = x.warn;
    }
    s.last_fatal_xid = x.last_fatal;
    s.last_warn_xid = x.last_warn;
  }
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
  if (!available()) return out;
  std::lock_guard lock(impl_->mu);
  impl_->drain_xid_events(nullptr);  // once for every GPU: the event set is shared
  for (unsigned i = 0; i < impl_->count; ++i) {
    const NvmlDeviceSample s = impl_->sample_locked(i);
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
    out.push_back({CounterId{"nvml", dev, 0, "xid_fatal"}, s.xid_fatal});
    out.push_back({CounterId{"nvml", dev, 0, "xid_warn"}, s.xid_warn});
  }
  return out;
}

}  // namespace ringfence::health
