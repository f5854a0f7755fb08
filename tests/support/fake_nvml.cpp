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
// Any counter value may be "NS": that call (or field entry) returns NVML_ERROR_NOT_SUPPORTED.
// "d0.nvlink NS" makes every link of GPU 0 unsupported; "d0.remapped NS" the row-remap call.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

// The opaque device type of the handles (nvmlDevice_t is a pointer to an incomplete struct).
struct DeviceSt;

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kUninitialized = 1;

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
    if (ls >> k >> v) s.kv[k] = v;
  }
  return s;
}

// Reference count of nvmlInit/nvmlShutdown pairs, as real NVML keeps one. Test support only:
// the library proper has no global state.
int g_init_count = 0;

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

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const int rc = static_cast<int>(load().num("init", 0));
  if (rc == kSuccess) ++g_init_count;
  return rc;
}

int nvmlShutdown() {
  if (g_init_count == 0) return kUninitialized;
  --g_init_count;
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

}  // extern "C"
