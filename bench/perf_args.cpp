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

namespace {

// ------------------------------------------------------------------------------------------
// Command line
// ------------------------------------------------------------------------------------------

constexpr DataType kAllTypes[] = {DataType::Int8,  DataType::Uint8,   DataType::Int32,    DataType::Uint32,
                                  DataType::Int64, DataType::Uint64,  DataType::Float16,  DataType::BFloat16,
                                  DataType::Float32, DataType::Float64};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

std::optional<int> parse_int(std::string_view text, int lo, int hi) {
  const auto v = parse_size(text);  // plain decimal; suffixes are harmless for counts
  if (!v || *v < static_cast<std::size_t>(lo) || *v > static_cast<std::size_t>(hi)) return std::nullopt;
  return static_cast<int>(*v);
}

void print_usage(const char* program) {
  std::printf(
      "USAGE: %s\n"
      "  nccl-tests options (same meanings and defaults):\n"
      "  -t,--nthreads <num threads>            (default 1; ranks are processes here: only 1)\n"
      "  -g,--ngpus <gpus per thread>           (default 1; one device or host buffer set per rank: only 1)\n"
      "  -b,--minbytes <min size in bytes>      (default 32M; K/M/G/T suffixes)\n"
      "  -e,--maxbytes <max size in bytes>      (default 32M)\n"
      "  -i,--stepbytes <increment size>        (default 1M; used when -f <= 1)\n"
      "  -f,--stepfactor <increment factor>     (default 1)\n"
      "  -n,--iters <iteration count>           (default 20)\n"
      "  -m,--agg_iters <aggregated iteration count>  collectives per timed iteration (default 1)\n"
      "  -w,--warmup_iters <warmup iteration count>   (default 1, before each measurement)\n"
      "  -N,--run_cycles <cycle count>          run and print each cycle (default 1; 0 = until killed)\n"
      "  -p,--parallel_init <0/1>               (accepted; one thread per rank initialises)\n"
      "  -c,--check <check iteration count>     (default 1; 0 = no #wrong check)\n"
      "  -o,--op <sum/prod/min/max/avg/all>     (default sum)\n"
      "  -d,--datatype <nccltype/all>           int8, uint8, int32, uint32, int64, uint64, half,\n"
      "                                         bfloat16, float, double (default float)\n"
      "  -r,--root <root>                       broadcast and reduce (default 0)\n"
      "  -z,--blocking <0/1>                    (accepted; host collectives block anyway)\n"
      "  -y,--stream_null <0/1>                 (accepted; host collectives use no stream)\n"
      "  -T,--timeout <time in seconds>         a call waiting longer for a peer fails (default: the backend's)\n"
      "  -G,--cudagraph <num graph launches>    (only 0: no CUDA graphs in this driver)\n"
      "  -C,--report_cputime <0/1>              (accepted; times are CPU wall-clock times anyway)\n"
      "  -a,--average <0/1/2/3>                 report time of rank 0/avg/min/max over ranks (default 1)\n"
      "  -R,--local_register <0/1/2>            1: buffers registered (ringfence registers on first use);\n"
      "                                         2 (symmetric) is refused\n"
      "  -J,--output_file <file>                also write the results as JSON (bench/README.md)\n"
      "  ringfence options:\n"
      "  --memory <user/alloc/device>           buffers: page-aligned heap memory, the\n"
      "                                         communicator's allocator, or device memory\n"
      "                                         (default user; device for --backend nccl)\n"
      "  --backend <ringfence/nccl>             collectives of ringfence, or of the NCCL in\n"
      "                                         --nccl-lib loaded with dlopen (default ringfence)\n"
      "  --nccl-lib <path>                      NCCL library for --backend nccl (default libnccl.so.2)\n"
      "  --fresh-send <0/1>                     1: rewrite the send buffer before each timed call\n"
      "                                         (untimed), as a producer leaves it\n"
      "                                         (default 0)\n"
      "  -h,--help\n",
      program);
}

}  // namespace

ParseOutcome parse_args(int argc, char** argv, const char* program, bool verbose) {
  // Long options without a letter.
  constexpr int kBackendOption = 1000, kNcclLibOption = 1001, kMemoryOption = 1002, kFreshSendOption = 1003;
  static const option kLong[] = {
      {"nthreads", required_argument, nullptr, 't'},      {"ngpus", required_argument, nullptr, 'g'},
      {"minbytes", required_argument, nullptr, 'b'},      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'},     {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},         {"agg_iters", required_argument, nullptr, 'm'},
      {"warmup_iters", required_argument, nullptr, 'w'},  {"run_cycles", required_argument, nullptr, 'N'},
      {"parallel_init", required_argument, nullptr, 'p'}, {"check", required_argument, nullptr, 'c'},
      {"op", required_argument, nullptr, 'o'},            {"datatype", required_argument, nullptr, 'd'},
      {"root", required_argument, nullptr, 'r'},          {"blocking", required_argument, nullptr, 'z'},
      {"stream_null", required_argument, nullptr, 'y'},   {"timeout", required_argument, nullptr, 'T'},
      {"cudagraph", required_argument, nullptr, 'G'},     {"report_cputime", required_argument, nullptr, 'C'},
      {"average", required_argument, nullptr, 'a'},       {"local_register", required_argument, nullptr, 'R'},
      {"output_file", required_argument, nullptr, 'J'},   {"help", no_argument, nullptr, 'h'},
      {"memory", required_argument, nullptr, kMemoryOption},
      {"backend", required_argument, nullptr, kBackendOption},
      {"nccl-lib", required_argument, nullptr, kNcclLibOption},
      {"fresh-send", required_argument, nullptr, kFreshSendOption},
      {nullptr, 0, nullptr, 0}};
  PerfArgs args;
  ParseOutcome out;
  auto fail = [&](const char* flag, const char* value, const char* expected) {
    if (verbose) std::fprintf(stderr, "%s: invalid value '%s' for %s: expected %s\n", program, value, flag, expected);
    out.exit_code = 2;
    return out;
  };
  // An nccl-tests option whose value cannot apply to this driver: one line, exit 2.
  auto cannot = [&](const char* flag, const char* value, const char* why) {
    if (verbose) std::fprintf(stderr, "%s: %s %s cannot apply here: %s\n", program, flag, value, why);
    out.exit_code = 2;
    return out;
  };
  ::opterr = verbose ? 1 : 0;
  ::optind = 1;
  for (;;) {
    const int c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:J:h", kLong, nullptr);
    if (c == -1) break;
    const std::string_view v = ::optarg ? ::optarg : "";
    const auto flag01 = [&](const char* flag) -> bool {  // a 0/1 value nccl-tests accepts
      return v == "0" || v == "1" || (fail(flag, ::optarg, "0 or 1"), false);
    };
    switch (c) {
      case 't':
        if (auto s = parse_int(v, 1, 1 << 20); !s) return fail("-t", ::optarg, ">= 1");
        else if (*s != 1) return cannot("-t", ::optarg, "ranks are processes (one thread each): start more ranks instead");
        break;
      case 'g':
        if (auto s = parse_int(v, 1, 1 << 20); !s) return fail("-g", ::optarg, ">= 1");
        else if (*s != 1) return cannot("-g", ::optarg, "one GPU (or host buffer set) per rank: start one rank per GPU");
        break;
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
      case 'm':
        if (auto s = parse_int(v, 1, 1 << 20)) args.agg_iters = *s;
        else if (v == "user" || v == "alloc" || v == "device")
          return fail("-m", ::optarg, "a count: -m is nccl-tests' --agg_iters; buffers are chosen with --memory");
        else return fail("-m", ::optarg, ">= 1 (aggregated iterations)");
        break;
      case 'w':
        if (auto s = parse_int(v, 0, 1 << 30)) args.warmup = *s; else return fail("-w", ::optarg, ">= 0");
        break;
      case 'N':
        if (auto s = parse_int(v, 0, 1 << 30)) args.run_cycles = *s; else return fail("-N", ::optarg, ">= 0 (0 = until killed)");
        break;
      case 'p':
        if (!flag01("-p")) return out;
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
        } else if (v == "mulsum") {
          return cannot("-o", ::optarg, "no pre-multiplied sum (ncclRedOpCreatePreMulSum) in ringfence");
        } else {
          return fail("-o", ::optarg, "sum, prod, min, max, avg or all");
        }
        break;
      case 'd':
        if (v == "all") {
          args.types.assign(std::begin(kAllTypes), std::end(kAllTypes));
        } else if (auto t = parse_data_type(v)) {
          args.types = {*t};
        } else if (v == "f8e4m3" || v == "f8e5m2" || v == "fp8_e4m3" || v == "fp8_e5m2") {
          return cannot("-d", ::optarg, "no float8 types in ringfence");
        } else {
          return fail("-d", ::optarg, "int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double or all");
        }
        break;
      case 'r':
        if (auto s = parse_int(v, 0, 1 << 20)) args.root = *s; else return fail("-r", ::optarg, "a rank >= 0");
        break;
      case 'z':
        if (!flag01("-z")) return out;
        break;
      case 'y':
        if (!flag01("-y")) return out;
        break;
      case 'T':
        if (auto s = parse_int(v, 0, 1 << 30)) args.timeout_s = *s; else return fail("-T", ::optarg, "seconds >= 0");
        break;
      case 'G':
        if (auto s = parse_int(v, 0, 1 << 30); !s) return fail("-G", ::optarg, ">= 0");
        else if (*s != 0) return cannot("-G", ::optarg, "no CUDA graphs in this driver (collectives are host calls)");
        break;
      case 'C':
        if (!flag01("-C")) return out;
        break;
      case 'R':
        if (v == "0" || v == "1") break;
        if (v == "2") return cannot("-R", ::optarg, "no symmetric memory windows in ringfence");
        return fail("-R", ::optarg, "0, 1 or 2");
      case 'J':
        if (v.empty()) return fail("-J", ::optarg, "a file name");
        args.json_file = std::string(v);
        break;
      case kMemoryOption:
        if (v == "user") args.memory = MemoryMode::User;
        else if (v == "alloc") args.memory = MemoryMode::Alloc;
        else if (v == "device") args.memory = MemoryMode::Device;
        else return fail("--memory", ::optarg, "user, alloc or device");
        args.memory_set = true;
        break;
      case kBackendOption:
        if (v == "ringfence" || v == "nccl") args.backend = std::string(v);
        else return fail("--backend", ::optarg, "ringfence or nccl");
        break;
      case kFreshSendOption:
        if (!flag01("--fresh-send")) return out;
        args.fresh_send = v == "1";
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
