// A fake NVML shared library for CPU-only tests of the NVML health source.
//
// It exports the handful of NVML symbols ringfence resolves with dlsym, with the same C ABI.
// Every call re-reads a small text file named by the environment variable
// RINGFENCE_FAKE_NVML_STATE (test-support code: reading the environment here is intended), so a
// test drives a counter storm by rewriting the file between samples. No file = defaults.
//
// File format: one "key value" per line, '#' starts a comment. Missing keys take the default.
//   init 0                 return code of nvmlInit_v2 (e.g. 9 = DRIVER_NOT_LOADED)
//   count 2                number of GPUs (default 1)
//   links 4                NVLinks per GPU (default 4); links >= this answer INVALID_ARGUMENT
//   d0.l1.state 0          NVLink state: 1 active (default), 0 inactive
//   d0.l1.crc_flit 123     NVLink counters: crc_flit, crc_data, replay, recovery (default 0)
//   d0.ecc_corrected 5     ecc_corrected, ecc_uncorrected, pcie_replay (default 0)
//   d0.remapped_cor 1      remapped_cor, remapped_unc, remap_pending, remap_failure (default 0)
//   d0.bus 0000:3b:00.0    PCI bus id (nvmlDeviceGetPciInfo_v3), any spelling; written verbatim
//                          into busId and re-printed NVML-style into busIdLegacy. Default: a
//                          distinct made-up id per device, "00000000:0N:00.0" (bus = N, in hex)
//   d0.l1.remote 0000:3c:00.0   far end of NVLink 1 (nvmlDeviceGetNvLinkRemotePciInfo_v2), filled
//                          like d0.bus. Default: none, answered as SUCCESS with a zeroed struct
//                          (empty bus id strings), which the source must treat as "no peer"
//   d0.l1.type switch      far end's kind (nvmlDeviceGetNvLinkRemoteDeviceType): gpu (default),
//                          npu, switch, unknown (0xFF), or NS (NOT_SUPPORTED)
//   d0.xids 74 48 13       Xid events of GPU 0, space- or comma-separated, oldest first (see below)
//   d0.event_types 0x8     mask nvmlDeviceGetSupportedEventTypes reports (default 0xf: SBE, DBE,
//                          PState, Xid)
//   events NS              nvmlDeviceRegisterEvents returns NOT_SUPPORTED on every GPU; a number
//                          is returned as the error code (e.g. "events 999" = NVML_ERROR_UNKNOWN);
//                          "d0.events NS" does the same for GPU 0 only
//   wait 15                nvmlEventSetWait_v2 returns this code (15 = GPU_IS_LOST) instead of events
// Any counter value may be "NS": that call (or field entry) returns NVML_ERROR_NOT_SUPPORTED.
// "d0.nvlink NS" makes every link of GPU 0 unsupported; "d0.remapped NS" the row-remap call.
//
// Events. Like real NVML, an event set only sees events that happen after a GPU was registered
// with it, and every set sees each of them once: nvmlDeviceRegisterEvents remembers, per set and
// GPU, how many entries `dN.xids` listed at that moment, and nvmlEventSetWait_v2 delivers the
// entries listed after them one per call, in list order (GPU 0's first, then GPU 1's, ...),
// then returns NVML_ERROR_TIMEOUT (10). The list only grows: append to it to raise new Xids.
// The event sets are global state of this test library (the file is re-read on every call,
// so what was delivered must be remembered somewhere); ringfenceFakeNvmlOpenEventSets() tells a
// test how many sets are not freed yet.
//
// Built twice: libringfence_fake_nvml and, with RINGFENCE_FAKE_NVML_NO_EVENTS, a variant that
// exports no event symbols at all (a library too old or too stripped for Xid events).
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

// The opaque device type of the handles (nvmlDevice_t is a pointer to an incomplete struct).
struct DeviceSt;
// Likewise for event sets.
struct EventSetSt;

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kUninitialized = 1;
constexpr int kTimeout = 10;

struct State {
  std::map<std::string, std::string> kv;
  bool has(const std::string& k) const { return kv.count(k) != 0; }
  // Returns kSuccess and the value, or kNotSupported for "NS".
  int get(const std::string& k, unsigned long long& out, unsigned long long dflt = 0) const {
    auto it = kv.find(k);
    if (it == kv.end()) {
      out = dflt;
      return kSuccess;
    }
    if (it->second == "NS") return kNotSupported;
    out = std::strtoull(it->second.c_str(), nullptr, 0);
    return kSuccess;
  }
  unsigned long long num(const std::string& k, unsigned long long dflt) const {
    unsigned long long v = dflt;
    return get(k, v, dflt) == kSuccess ? v : dflt;
  }
};

State load() {
  State s;
  const char* path = std::getenv("RINGFENCE_FAKE_NVML_STATE");
  if (path == nullptr) return s;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string k, v;
    // The value is the rest of the line (lists such as "d0.xids 74 48"), without trailing blanks.
    if (ls >> k >> std::ws && std::getline(ls, v)) {
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.pop_back();
      if (!v.empty()) s.kv[k] = v;
    }
  }
  return s;
}

// Reference count of nvmlInit/nvmlShutdown pairs, as real NVML keeps one. Test support only:
// the library proper has no global state. Atomic because, as with real NVML, any thread may
// call any function: thread ranks in one process each init and shut down their own source.
std::atomic<int> g_init_count{0};

// Device handles are small integers disguised as pointers (index + 1).
DeviceSt* handle_of(unsigned i) { return reinterpret_cast<DeviceSt*>(static_cast<std::uintptr_t>(i) + 1); }
long index_of(DeviceSt* d) { return static_cast<long>(reinterpret_cast<std::uintptr_t>(d)) - 1; }

std::string dev_key(DeviceSt* d, const char* name) { return "d" + std::to_string(index_of(d)) + "." + name; }

bool valid(const State& s, DeviceSt* d) {
  const long i = index_of(d);
  return i >= 0 && static_cast<unsigned long long>(i) < s.num("count", 1);
}

union Value {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  unsigned short usVal;
};
struct FieldValue {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  int nvmlReturn;
  Value value;
};

// nvmlPciInfo_t as the _v2/_v3 symbols fill it (68 bytes).
struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
static_assert(sizeof(PciInfo) == 68);

// Fills `p` from a bus id spelled any way: busId verbatim (truncated to 31 characters),
// domain/bus/device and busIdLegacy ("%04X:%02X:%02X.%X") when it parses.
void fill_pci(PciInfo* p, const std::string& id) {
  std::memset(p, 0, sizeof *p);
  std::memcpy(p->busId, id.data(), id.size() < sizeof p->busId ? id.size() : sizeof p->busId - 1);
  unsigned d = 0, b = 0, dev = 0, f = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x", &d, &b, &dev, &f) == 4) {
    p->domain = d;
    p->bus = b;
    p->device = dev;
    std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", d & 0xffffu, b & 0xffu, dev & 0x1fu,
                  f & 0x7u);
  }
}

#ifndef RINGFENCE_FAKE_NVML_NO_EVENTS
// nvmlEventData_t (32 bytes).
struct EventData {
  DeviceSt* device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(EventData) == 32);

constexpr unsigned long long kXidCriticalError = 0x8;

// Event sets: id -> (GPU index -> entries of dN.xids already delivered or predating registration).
std::mutex g_events_mu;
std::map<std::uintptr_t, std::map<long, std::size_t>> g_sets;
std::uintptr_t g_next_set = 1;

std::vector<unsigned long long> xid_list(const State& s, long dev) {
  std::vector<unsigned long long> out;
  auto it = s.kv.find("d" + std::to_string(dev) + ".xids");
  if (it == s.kv.end()) return out;
  std::string text = it->second;
  for (char& c : text)
    if (c == ',') c = ' ';
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) out.push_back(std::strtoull(tok.c_str(), nullptr, 0));
  return out;
}

std::uintptr_t set_id(EventSetSt* set) { return reinterpret_cast<std::uintptr_t>(set); }
#endif

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const int rc = static_cast<int>(load().num("init", 0));
  if (rc == kSuccess) ++g_init_count;
  return rc;
}

int nvmlShutdown() {
  int n = g_init_count.load();
  do {
    if (n == 0) return kUninitialized;
  } while (!g_init_count.compare_exchange_weak(n, n - 1));
  return kSuccess;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_init_count == 0) return kUninitialized;
  *count = static_cast<unsigned>(load().num("count", 1));
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, DeviceSt** device) {
  if (g_init_count == 0) return kUninitialized;
  if (index >= load().num("count", 1)) return kInvalidArgument;
  *device = handle_of(index);
  return kSuccess;
}

int nvmlDeviceGetNvLinkState(DeviceSt* device, unsigned int link, int* is_active) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  if (s.has(dev_key(device, "nvlink"))) return kNotSupported;
  if (link >= s.num("links", 4)) return kInvalidArgument;
  unsigned long long v = 1;
  if (const int rc = s.get(dev_key(device, ("l" + std::to_string(link) + ".state").c_str()), v, 1); rc != kSuccess)
    return rc;
  *is_active = v != 0 ? 1 : 0;
  return kSuccess;
}

int nvmlDeviceGetFieldValues(DeviceSt* device, int count, FieldValue* values) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  for (int i = 0; i < count; ++i) {
    FieldValue& f = values[i];
    const char* name = f.fieldId == 38   ? "crc_flit"
                       : f.fieldId == 45 ? "crc_data"
                       : f.fieldId == 52 ? "replay"
                       : f.fieldId == 59 ? "recovery"
                                         : nullptr;
    if (name == nullptr || f.scopeId >= s.num("links", 4) || s.has(dev_key(device, "nvlink"))) {
      f.nvmlReturn = kNotSupported;
      continue;
    }
    unsigned long long v = 0;
    f.nvmlReturn = s.get(dev_key(device, ("l" + std::to_string(f.scopeId) + "." + name).c_str()), v);
    f.valueType = 3;  // NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    f.value.ullVal = v;
  }
  return kSuccess;
}

int nvmlDeviceGetTotalEccErrors(DeviceSt* device, int error_type, int counter_type, unsigned long long* count) {
  const State s = load();
  if (!valid(s, device) || counter_type != 0) return kInvalidArgument;  // only volatile is faked
  return s.get(dev_key(device, error_type == 0 ? "ecc_corrected" : "ecc_uncorrected"), *count);
}

int nvmlDeviceGetRemappedRows(DeviceSt* device, unsigned int* corr, unsigned int* unc, unsigned int* pending,
                              unsigned int* failure) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  if (s.has(dev_key(device, "remapped"))) return kNotSupported;
  *corr = static_cast<unsigned>(s.num(dev_key(device, "remapped_cor"), 0));
  *unc = static_cast<unsigned>(s.num(dev_key(device, "remapped_unc"), 0));
  *pending = static_cast<unsigned>(s.num(dev_key(device, "remap_pending"), 0));
  *failure = static_cast<unsigned>(s.num(dev_key(device, "remap_failure"), 0));
  return kSuccess;
}

int nvmlDeviceGetPcieReplayCounter(DeviceSt* device, unsigned int* value) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  unsigned long long v = 0;
  const int rc = s.get(dev_key(device, "pcie_replay"), v);
  *value = static_cast<unsigned>(v);
  return rc;
}

int nvmlDeviceGetPciInfo_v3(DeviceSt* device, PciInfo* pci) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  const std::string key = dev_key(device, "bus");
  auto it = s.kv.find(key);
  if (it != s.kv.end() && it->second == "NS") return kNotSupported;
  char dflt[32];
  std::snprintf(dflt, sizeof dflt, "00000000:%02lX:00.0", static_cast<unsigned long>(index_of(device)) & 0xffu);
  fill_pci(pci, it != s.kv.end() ? it->second : std::string(dflt));
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(DeviceSt* device, unsigned int link, PciInfo* pci) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  if (s.has(dev_key(device, "nvlink"))) return kNotSupported;
  if (link >= s.num("links", 4)) return kInvalidArgument;
  auto it = s.kv.find(dev_key(device, ("l" + std::to_string(link) + ".remote").c_str()));
  if (it != s.kv.end() && it->second == "NS") return kNotSupported;
  fill_pci(pci, it != s.kv.end() ? it->second : std::string());  // unconnected: zeroed, as documented above
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(DeviceSt* device, unsigned int link, int* type) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  if (s.has(dev_key(device, "nvlink"))) return kNotSupported;
  if (link >= s.num("links", 4)) return kInvalidArgument;
  auto it = s.kv.find(dev_key(device, ("l" + std::to_string(link) + ".type").c_str()));
  const std::string kind = it != s.kv.end() ? it->second : std::string("gpu");
  if (kind == "NS") return kNotSupported;
  *type = kind == "gpu" ? 0 : kind == "npu" ? 1 : kind == "switch" ? 2 : 0xFF;
  return kSuccess;
}

#ifndef RINGFENCE_FAKE_NVML_NO_EVENTS

int nvmlEventSetCreate(EventSetSt** set) {
  if (g_init_count == 0) return kUninitialized;
  std::lock_guard lock(g_events_mu);
  const std::uintptr_t id = g_next_set++;
  g_sets[id];
  *set = reinterpret_cast<EventSetSt*>(id);
  return kSuccess;
}

int nvmlDeviceGetSupportedEventTypes(DeviceSt* device, unsigned long long* types) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  return s.get(dev_key(device, "event_types"), *types, 0xf);
}

int nvmlDeviceRegisterEvents(DeviceSt* device, unsigned long long types, EventSetSt* set) {
  const State s = load();
  if (!valid(s, device)) return kInvalidArgument;
  for (const std::string& key : {std::string("events"), dev_key(device, "events")}) {
    unsigned long long rc = 0;
    if (const int r = s.get(key, rc); r != kSuccess) return r;
    if (rc != 0) return static_cast<int>(rc);
  }
  std::lock_guard lock(g_events_mu);
  auto it = g_sets.find(set_id(set));
  if (it == g_sets.end()) return kInvalidArgument;
  // Events listed before registration are not recorded, as in NVML.
  if ((types & kXidCriticalError) != 0) it->second[index_of(device)] = xid_list(s, index_of(device)).size();
  return kSuccess;
}

int nvmlEventSetWait_v2(EventSetSt* set, EventData* data, unsigned int /*timeout_ms*/) {
  const State s = load();
  if (const int rc = static_cast<int>(s.num("wait", 0)); rc != kSuccess) return rc;
  std::lock_guard lock(g_events_mu);
  auto it = g_sets.find(set_id(set));
  if (it == g_sets.end()) return kInvalidArgument;
  for (auto& [dev, delivered] : it->second) {
    const std::vector<unsigned long long> xids = xid_list(s, dev);
    if (delivered >= xids.size()) continue;
    std::memset(data, 0, sizeof *data);
    data->device = handle_of(static_cast<unsigned>(dev));
    data->eventType = kXidCriticalError;
    data->eventData = xids[delivered++];
    data->gpuInstanceId = 0xFFFFFFFFu;  // not MIG-attributable
    data->computeInstanceId = 0xFFFFFFFFu;
    return kSuccess;
  }
  return kTimeout;  // nothing pending (the fake never waits)
}

int nvmlEventSetFree(EventSetSt* set) {
  std::lock_guard lock(g_events_mu);
  return g_sets.erase(set_id(set)) == 1 ? kSuccess : kInvalidArgument;
}

// Test hook, not NVML: event sets created and not freed yet.
int ringfenceFakeNvmlOpenEventSets() {
  std::lock_guard lock(g_events_mu);
  return static_cast<int>(g_sets.size());
}

#endif  // RINGFENCE_FAKE_NVML_NO_EVENTS

}  // extern "C"
