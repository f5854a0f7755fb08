// Command line of the perf programs: nccl-tests' options with their meanings and defaults,
// plus ringfence's own long options (perf_common.hpp, bench/README.md).
#include <getopt.h>

#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "perf_common.hpp"

namespace ringfence::bench {
namespace {

// ------------------------------------------------------------------------------------------
// Command line
// ------------------------------------------------------------------------------------------

constexpr DataType kAllTypes[] = {DataType::Int8,  DataType::Uint8,   DataType::Int32,    DataType::Uint32,
                                  DataType::Int64, DataType::Uint64,  DataType::Float16,  DataType::BFloat16,
                                  DataType::Float32, DataType::Float64};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

// nccl-tests' parsesize: a decimal count with an optional K/M/G/T suffix (powers of 1024).
std::optional<std::size_t> parse_size(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::size_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const std::size_t digit = static_cast<std::size_t>(text[i] - '0');
    if (value > (std::numeric_limits<std::size_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  std::size_t shift = 0;
  if (i < text.size()) {
    switch (text[i]) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      default: return std::nullopt;
    }
    ++i;
    if (i < text.size() && (text[i] == 'b' || text[i] == 'B')) ++i;  // "64KB" too
  }
  if (i != text.size()) return std::nullopt;
  if (shift != 0 && value > (std::numeric_limits<std::size_t>::max() >> shift)) return std::nullopt;
  return value << shift;
}

std::optional<int> parse_int(std::string_view text, int lo, int hi) {
  const auto v = parse_size(text);  // plain decimal; suffixes are harmless for counts
  if (!v || *v < static_cast<std::size_t>(lo) || *v > static_cast<std::size_t>(hi)) return std::nullopt;
  return static_cast<int>(*v);
}

void print_usage(const char* program) {
  std::printf(
      "USAGE: %s\n"
      "  -b,--minbytes <min size in bytes>      (default 32M; K/M/G/T suffixes)\n"
      "  -e,--maxbytes <max size in bytes>      (default 32M)\n"
      "  -i,--stepbytes <increment size>        (default 1M; used when -f <= 1)\n"
      "  -f,--stepfactor <increment factor>     (default 1)\n"
      "  -n,--iters <iteration count>           (default 20)\n"
      "  -w,--warmup_iters <warmup count>       (default 5, before each measurement)\n"
      "  -c,--check <check iteration count>     (default 1; 0 = no #wrong check)\n"
      "  -o,--op <sum/prod/min/max/avg/all>     (default sum)\n"
      "  -d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/bfloat16/float/double/all>\n"
      "                                         (default float)\n"
      "  -r,--root <root rank>                  broadcast and reduce (default 0)\n"
      "  -a,--average <0/1/2/3>                 time reported: rank 0/avg/min/max over ranks (default 3)\n"
      "  -m,--memory <user/alloc/device>        buffers: page-aligned heap memory, the\n"
      "                                         communicator's allocator, or device memory\n"
      "                                         (default user; device for --backend nccl)\n"
      "  --backend <ringfence/nccl>             collectives of ringfence, or of the NCCL in\n"
      "                                         --nccl-lib loaded with dlopen (default ringfence)\n"
      "  --nccl-lib <path>                      NCCL library for --backend nccl (default libnccl.so.2)\n"
      "  -h,--help\n",
      program);
}

}  // namespace

ParseOutcome parse_args(int argc, char** argv, const char* program, bool verbose) {
  constexpr int kBackendOption = 1000, kNcclLibOption = 1001;  // long options without a letter
  static const option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},  {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'}, {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},     {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},     {"op", required_argument, nullptr, 'o'},
      {"datatype", required_argument, nullptr, 'd'},  {"average", required_argument, nullptr, 'a'},
      {"memory", required_argument, nullptr, 'm'},    {"help", no_argument, nullptr, 'h'},
      {"root", required_argument, nullptr, 'r'},      {"backend", required_argument, nullptr, kBackendOption},
      {"nccl-lib", required_argument, nullptr, kNcclLibOption},
      {nullptr, 0, nullptr, 0}};
  PerfArgs args;
  ParseOutcome out;
  auto fail = [&](const char* flag, const char* value, const char* expected) {
    if (verbose) std::fprintf(stderr, "%s: invalid value '%s' for %s: expected %s\n", program, value, flag, expected);
    out.exit_code = 2;
    return out;
  };
  ::opterr = verbose ? 1 : 0;
  ::optind = 1;
  for (;;) {
    const int c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:a:m:r:h", kLong, nullptr);
    if (c == -1) break;
    const std::string_view v = ::optarg ? ::optarg : "";
    switch (c) {
      case 'b':
        if (auto s = parse_size(v)) args.min_bytes = *s; else return fail("-b", ::optarg, "a size like 8, 64K, 1M");
        break;
      case 'e':
        if (auto s = parse_size(v)) args.max_bytes = *s; else return fail("-e", ::optarg, "a size like 8, 64K, 1M");
        break;
      case 'i':
        if (auto s = parse_size(v)) args.step_bytes = *s; else return fail("-i", ::optarg, "a size");
        break;
      case 'f':
        if (auto s = parse_size(v); s && *s <= 1024) args.step_factor = *s; else return fail("-f", ::optarg, "0..1024");
        break;
      case 'n':
        if (auto s = parse_int(v, 1, 1 << 30)) args.iters = *s; else return fail("-n", ::optarg, ">= 1");
        break;
      case 'w':
        if (auto s = parse_int(v, 0, 1 << 30)) args.warmup = *s; else return fail("-w", ::optarg, ">= 0");
        break;
      case 'c':
        if (auto s = parse_int(v, 0, 1 << 30)) args.check = *s; else return fail("-c", ::optarg, ">= 0");
        break;
      case 'a':
        if (auto s = parse_int(v, 0, 3)) args.aggregate = static_cast<TimeAggregate>(*s);
        else return fail("-a", ::optarg, "0 (rank 0), 1 (avg), 2 (min) or 3 (max)");
        break;
      case 'o':
        if (v == "all") {
          args.ops.assign(std::begin(kAllOps), std::end(kAllOps));
        } else if (auto op = parse_reduce_op(v)) {
          args.ops = {*op};
        } else {
          return fail("-o", ::optarg, "sum, prod, min, max, avg or all");
        }
        break;
      case 'd':
        if (v == "all") {
          args.types.assign(std::begin(kAllTypes), std::end(kAllTypes));
        } else if (auto t = parse_data_type(v)) {
          args.types = {*t};
        } else {
          return fail("-d", ::optarg, "int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double or all");
        }
        break;
      case 'r':
        if (auto s = parse_int(v, 0, 1 << 20)) args.root = *s; else return fail("-r", ::optarg, "a rank >= 0");
        break;
      case 'm':
        if (v == "user") args.memory = MemoryMode::User;
        else if (v == "alloc") args.memory = MemoryMode::Alloc;
        else if (v == "device") args.memory = MemoryMode::Device;
        else return fail("-m", ::optarg, "user, alloc or device");
        args.memory_set = true;
        break;
      case kBackendOption:
        if (v == "ringfence" || v == "nccl") args.backend = std::string(v);
        else return fail("--backend", ::optarg, "ringfence or nccl");
        break;
      case kNcclLibOption:
        if (v.empty()) return fail("--nccl-lib", ::optarg, "a library path or name");
        args.nccl_library = std::string(v);
        break;
      case 'h':
        if (verbose) print_usage(program);
        out.exit_code = 0;
        return out;
      default:  // getopt already printed the offending option when verbose
        if (verbose) print_usage(program);
        out.exit_code = 2;
        return out;
    }
  }
  if (::optind < argc) {
    if (verbose) std::fprintf(stderr, "%s: unexpected argument '%s' (see -h)\n", program, argv[::optind]);
    out.exit_code = 2;
    return out;
  }
  if (args.min_bytes > args.max_bytes) {
    if (verbose)
      std::fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", program, args.min_bytes, args.max_bytes);
    out.exit_code = 2;
    return out;
  }
  if (args.step_factor <= 1 && args.step_bytes == 0 && args.min_bytes != args.max_bytes) {
    if (verbose) std::fprintf(stderr, "%s: -i 0 with -f <= 1 never reaches -e\n", program);
    out.exit_code = 2;
    return out;
  }
  out.args = std::move(args);
  return out;
}


}  // namespace ringfence::bench
