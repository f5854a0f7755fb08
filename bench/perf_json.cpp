// `-J file` (perf_json.hpp). Written by hand: the document is flat, and the perf programs
// depend on nothing but ringfence and the C++ library.
#include "perf_json.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ringfence::bench {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += esc;
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string measured(const Measured& m) {
  if (!m.ran) return "null";
  return "{\"time_us\": " + number(m.time_us) + ", \"algbw_gbps\": " + number(m.algbw) + ", \"busbw_gbps\": " +
         number(m.busbw) + ", \"wrong\": " + (m.wrong < 0 ? std::string("null") : std::to_string(m.wrong)) + "}";
}

const char* aggregate_key(TimeAggregate a) {
  switch (a) {
    case TimeAggregate::Rank0: return "rank0";
    case TimeAggregate::Avg: return "avg";
    case TimeAggregate::Min: return "min";
    case TimeAggregate::Max: return "max";
  }
  return "?";
}

}  // namespace

std::string write_json(const std::string& path, Collective c, const PerfArgs& a, const Backend& b,
                       const std::vector<ResultRow>& rows, std::uint64_t wrong, double avg_busbw) {
  std::string doc = "{\n";
  doc += "  \"program\": " + quoted(std::string(collective_name(c)) + "_perf") + ",\n";
  doc += "  \"backend\": " + quoted(b.name) + ",\n";
  doc += "  \"ranks\": " + std::to_string(b.size) + ",\n";
  doc += "  \"parameters\": {\"minbytes\": " + std::to_string(a.min_bytes) + ", \"maxbytes\": " + std::to_string(a.max_bytes) +
         ", \"stepbytes\": " + std::to_string(a.step_bytes) + ", \"stepfactor\": " + std::to_string(a.step_factor) +
         ", \"iters\": " + std::to_string(a.iters) + ", \"agg_iters\": " + std::to_string(a.agg_iters) +
         ", \"warmup_iters\": " + std::to_string(a.warmup) + ", \"run_cycles\": " + std::to_string(a.run_cycles) +
         ", \"check\": " + std::to_string(a.check) + ", \"average\": " + quoted(aggregate_key(a.aggregate)) +
         ", \"fresh_send\": " + (a.fresh_send ? "true" : "false") + "},\n";
  doc += "  \"results\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ResultRow& r = rows[i];
    doc += i ? ",\n    " : "\n    ";
    doc += "{\"cycle\": " + std::to_string(r.cycle) + ", \"size\": " + std::to_string(r.bytes) + ", \"count\": " +
           std::to_string(r.count) + ", \"type\": " + quoted(r.type) + ", \"redop\": " + quoted(r.redop) + ", \"root\": " +
           std::to_string(r.root) + ", \"out_of_place\": " + measured(r.out_of_place) + ", \"in_place\": " +
           measured(r.in_place) + "}";
  }
  doc += rows.empty() ? "],\n" : "\n  ],\n";
  doc += "  \"out_of_bounds\": " + std::to_string(wrong) + ",\n";
  doc += "  \"avg_busbw_gbps\": " + number(avg_busbw) + "\n}\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "-J " + path + ": " + std::strerror(errno);
  const bool ok = std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
  if (std::fclose(f) != 0 || !ok) return "-J " + path + ": write failed: " + std::strerror(errno);
  return "";
}

}  // namespace ringfence::bench
