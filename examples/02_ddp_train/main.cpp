// 02_ddp_train: data-parallel training of a small MLP whose gradients travel through ringfence.
//
//   build/bin/ringfence-run -n 4 build/bin/ddp_train [--steps N] [--csv PATH] [--label NAME]
//   examples/02_ddp_train/run.sh          # fault-free, faulty link, faulty link + health layer
//
// Every rank builds the same synthetic regression data set from a seed (a random "teacher"
// network labels Gaussian inputs), keeps its own shard, and trains a 16 -> H tanh -> 4 MLP with
// plain SGD. Each step: forward/backward on the local mini-batch, all gradients (plus the local
// loss) packed into one float32 buffer, one `allreduce(..., Float32, Avg)`, identical SGD update
// on every rank. Rank 0 prints the global loss and writes `step,loss` to the CSV.
//
// Bit-exactness across a fence: ringfence keeps the logical ring and relays the fenced hop
// through a healthy rank, so every element is reduced in the same order as before and plain
// float32 gradients give a protected curve byte-identical to the fault-free one.
// `--quantize on` (off by default) rounds values to a fixed-point grid first (multiples of
// 2^-20 for gradients, |g| < 4, 2^-16 for the loss): sums on that grid are exact in any order,
// which also makes the curve independent of a ring re-order (the fallback when no relay exists).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

namespace {

constexpr int kIn = 16;       // input features
constexpr int kOut = 4;       // regression outputs
constexpr int kTeacher = 8;   // hidden width of the teacher that labels the data
constexpr int kGlobalSamples = 8192;

struct Args {
  int steps = 300;
  int hidden = 1024;
  int batch = 128;  // per rank
  float lr = 0.2f;
  float momentum = 0.9f;
  std::uint64_t seed = 1;
  int print_every = 25;
  bool quantize = false;
  std::string csv;
  std::string label = "run";
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr,
               "ddp_train: %s\nusage: ddp_train [--steps N] [--csv PATH] [--label NAME] [--hidden H] [--batch B]\n"
               "                 [--lr X] [--momentum M] [--seed S] [--print-every K] [--quantize on|off]\n",
               msg.c_str());
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error("missing value for " + arg);
      return argv[++i];
    };
    auto number = [&](long lo, long hi) -> long {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi) usage_error("bad value for " + arg + ": " + v);
      return n;
    };
    if (arg == "--steps") a.steps = static_cast<int>(number(1, 1000000));
    else if (arg == "--hidden") a.hidden = static_cast<int>(number(1, 1 << 16));
    else if (arg == "--batch") a.batch = static_cast<int>(number(1, kGlobalSamples));
    else if (arg == "--seed") a.seed = static_cast<std::uint64_t>(number(0, 1L << 40));
    else if (arg == "--print-every") a.print_every = static_cast<int>(number(1, 1000000));
    else if (arg == "--lr") {
      const std::string v = value();
      char* end = nullptr;
      a.lr = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.lr > 0.0f)) usage_error("bad value for --lr: " + v);
    } else if (arg == "--momentum") {
      const std::string v = value();
      char* end = nullptr;
      a.momentum = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.momentum >= 0.0f && a.momentum < 1.0f)) usage_error("bad value for --momentum: " + v);
    } else if (arg == "--quantize") {
      const std::string v = value();
      if (v != "on" && v != "off") usage_error("--quantize takes on or off");
      a.quantize = v == "on";
    } else if (arg == "--csv") a.csv = value();
    else if (arg == "--label") a.label = value();
    else if (arg == "-h" || arg == "--help") usage_error("help");
    else usage_error("unknown argument " + arg);
  }
  return a;
}

// Deterministic random numbers: splitmix64, uniform doubles, Box-Muller normals.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double symmetric(double a) { return (2.0 * uniform() - 1.0) * a; }          // [-a, a)
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

// The global data set: identical on every rank, whatever the faults. Row-major x and y.
struct Dataset {
  std::vector<float> x;  // kGlobalSamples * kIn
  std::vector<float> y;  // kGlobalSamples * kOut
};

Dataset make_dataset(std::uint64_t seed) {
  Rng rng(seed * 0x100000001B3ull + 17);
  std::vector<double> w1(kTeacher * kIn), b1(kTeacher), w2(kOut * kTeacher), b2(kOut);
  for (double& w : w1) w = rng.normal() * 1.5 / std::sqrt(static_cast<double>(kIn));
  for (double& b : b1) b = rng.normal() * 0.5;
  for (double& w : w2) w = rng.normal() / std::sqrt(static_cast<double>(kTeacher));
  for (double& b : b2) b = rng.normal() * 0.1;
  Dataset d;
  d.x.resize(static_cast<std::size_t>(kGlobalSamples) * kIn);
  d.y.resize(static_cast<std::size_t>(kGlobalSamples) * kOut);
  for (int s = 0; s < kGlobalSamples; ++s) {
    double x[kIn];
    for (int i = 0; i < kIn; ++i) {
      x[i] = rng.normal();
      d.x[static_cast<std::size_t>(s) * kIn + static_cast<std::size_t>(i)] = static_cast<float>(x[i]);
    }
    double h[kTeacher];
    for (int j = 0; j < kTeacher; ++j) {
      double z = b1[static_cast<std::size_t>(j)];
      for (int i = 0; i < kIn; ++i) z += w1[static_cast<std::size_t>(j * kIn + i)] * x[i];
      h[j] = std::tanh(z);
    }
    for (int o = 0; o < kOut; ++o) {
      double v = b2[static_cast<std::size_t>(o)];
      for (int j = 0; j < kTeacher; ++j) v += w2[static_cast<std::size_t>(o * kTeacher + j)] * h[j];
      d.y[static_cast<std::size_t>(s) * kOut + static_cast<std::size_t>(o)] = static_cast<float>(v);
    }
  }
  return d;
}

// The student: 16 -> H (tanh) -> 4. All parameters live in one flat vector so that the gradient
// buffer has the same layout: [W1 (H x 16) | b1 (H) | W2 (4 x H) | b2 (4)].
struct Mlp {
  int hidden;
  std::size_t w1, b1, w2, b2, count;  // offsets and total size
  explicit Mlp(int h)
      : hidden(h),
        w1(0),
        b1(static_cast<std::size_t>(h) * kIn),
        w2(b1 + static_cast<std::size_t>(h)),
        b2(w2 + static_cast<std::size_t>(kOut) * static_cast<std::size_t>(h)),
        count(b2 + kOut) {}
};

std::vector<float> init_params(const Mlp& m, std::uint64_t seed) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + 99);
  std::vector<float> p(m.count, 0.0f);
  const double a1 = 1.0 / std::sqrt(static_cast<double>(kIn));
  const double a2 = 1.0 / std::sqrt(static_cast<double>(m.hidden));
  for (std::size_t i = m.w1; i < m.b1; ++i) p[i] = static_cast<float>(rng.symmetric(a1));
  for (std::size_t i = m.w2; i < m.b2; ++i) p[i] = static_cast<float>(rng.symmetric(a2));
  return p;  // biases start at zero
}

// Forward and backward over `n` samples starting at row `first` (wrapping within the shard
// [shard_begin, shard_begin + shard_size)). Writes gradients of the mean squared error into
// `g` (overwritten) and returns the mean loss. Fixed loop order: deterministic.
double forward_backward(const Mlp& m, const std::vector<float>& p, const Dataset& d, int shard_begin,
                        int shard_size, int first, int n, std::vector<float>& g) {
  const std::size_t H = static_cast<std::size_t>(m.hidden);
  std::fill(g.begin(), g.end(), 0.0f);
  std::vector<float> h(H), dz(H);
  double loss = 0.0;
  const float scale = 2.0f / static_cast<float>(kOut * n);
  for (int k = 0; k < n; ++k) {
    const std::size_t s = static_cast<std::size_t>(shard_begin + (first + k) % shard_size);
    const float* x = &d.x[s * kIn];
    const float* y = &d.y[s * kOut];
    for (std::size_t j = 0; j < H; ++j) {
      const float* w = &p[m.w1 + j * kIn];
      float z = p[m.b1 + j];
      for (int i = 0; i < kIn; ++i) z += w[i] * x[i];
      h[j] = std::tanh(z);
    }
    float dout[kOut];
    for (int o = 0; o < kOut; ++o) {
      const float* w = &p[m.w2 + static_cast<std::size_t>(o) * H];
      float v = p[m.b2 + static_cast<std::size_t>(o)];
      for (std::size_t j = 0; j < H; ++j) v += w[j] * h[j];
      const float err = v - y[o];
      loss += static_cast<double>(err) * static_cast<double>(err);
      dout[o] = scale * err;
    }
    std::fill(dz.begin(), dz.end(), 0.0f);
    for (int o = 0; o < kOut; ++o) {
      const float* w = &p[m.w2 + static_cast<std::size_t>(o) * H];
      float* gw = &g[m.w2 + static_cast<std::size_t>(o) * H];
      for (std::size_t j = 0; j < H; ++j) {
        gw[j] += dout[o] * h[j];
        dz[j] += dout[o] * w[j];
      }
      g[m.b2 + static_cast<std::size_t>(o)] += dout[o];
    }
    for (std::size_t j = 0; j < H; ++j) {
      const float dzj = dz[j] * (1.0f - h[j] * h[j]);
      float* gw = &g[m.w1 + j * kIn];
      for (int i = 0; i < kIn; ++i) gw[i] += dzj * x[i];
      g[m.b1 + j] += dzj;
    }
  }
  return loss / static_cast<double>(kOut * n);
}

// Rounds `v` to a multiple of 2^-frac_bits when |v| < 2^(22 - frac_bits): four such float32
// values then add exactly, in any order. Returns false (value unchanged) outside that range.
bool quantize(float& v, int frac_bits) {
  const float scaled = std::ldexp(v, frac_bits);
  if (!(std::fabs(scaled) < 0x1.0p22f)) return false;  // also NaN and inf
  v = std::ldexp(std::nearbyint(scaled), -frac_bits);
  return true;
}

std::string join(const std::vector<int>& v, char sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? std::string(1, sep) : "") + std::to_string(v[i]);
  return s;
}

std::string fenced_text(const std::vector<ringfence::LinkId>& links) {
  if (links.empty()) return "none";
  std::string s;
  for (std::size_t i = 0; i < links.size(); ++i)
    s += (i ? ", " : "") + std::to_string(links[i].a) + "-" + std::to_string(links[i].b);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    ringfence::Communicator comm = ringfence::Communicator::from_env();
    const int rank = comm.rank();
    const int n = comm.size();
    if (kGlobalSamples % n != 0) throw std::runtime_error("rank count must divide " + std::to_string(kGlobalSamples));
    const int shard = kGlobalSamples / n;
    const int shard_begin = rank * shard;

    const Dataset data = make_dataset(args.seed);
    const Mlp mlp(args.hidden);
    std::vector<float> params = init_params(mlp, args.seed);
    const std::size_t nparams = mlp.count;
    std::vector<float> grad(nparams);
    std::vector<float> velocity(nparams, 0.0f);
    std::vector<float> buf(nparams + 1);  // gradients, then the local loss

    std::FILE* csv = nullptr;
    if (rank == 0) {
      if (!args.csv.empty()) {
        csv = std::fopen(args.csv.c_str(), "w");
        if (!csv) throw std::runtime_error("cannot write " + args.csv);
        std::fprintf(csv, "step,loss\n");
      }
      const ringfence::CommOptions& o = comm.options();
      std::printf("ddp_train [%s]: %d ranks, MLP %d-%d-%d (%zu params, %zu B gradient buffer), %d steps, "
                  "batch %d/rank, lr %g, momentum %g\n",
                  args.label.c_str(), n, kIn, args.hidden, kOut, nparams, buf.size() * sizeof(float), args.steps,
                  args.batch, static_cast<double>(args.lr), static_cast<double>(args.momentum));
      std::printf("ddp_train [%s]: checksum %s, fault \"%s\", ring %s\n", args.label.c_str(),
                  o.checksum ? "on" : "off", o.fault.c_str(), join(comm.ring(), '-').c_str());
      std::fflush(stdout);
    }

    std::uint64_t unquantized = 0;  // values sent outside the exact grid (local count)
    std::uint64_t epoch_seen = comm.epoch();
    double loss = 0.0;
    int first_bad_step = -1;
    for (int step = 1; step <= args.steps; ++step) {
      const int first = ((step - 1) * args.batch) % shard;
      const double local = forward_backward(mlp, params, data, shard_begin, shard, first, args.batch, grad);
      std::copy(grad.begin(), grad.end(), buf.begin());
      buf[nparams] = static_cast<float>(local);
      if (args.quantize) {
        for (std::size_t i = 0; i < nparams; ++i) unquantized += !quantize(buf[i], 20);
        unquantized += !quantize(buf[nparams], 16);
      }
      comm.allreduce(buf.data(), buf.data(), buf.size(), ringfence::DataType::Float32, ringfence::ReduceOp::Avg);
      for (std::size_t i = 0; i < nparams; ++i) {  // SGD with momentum, identical on every rank
        velocity[i] = args.momentum * velocity[i] + buf[i];
        params[i] -= args.lr * velocity[i];
      }
      loss = static_cast<double>(buf[nparams]);
      if (first_bad_step < 0 && !std::isfinite(loss)) first_bad_step = step;

      if (rank == 0) {
        if (csv) std::fprintf(csv, "%d,%.9g\n", step, loss);
        if (comm.epoch() != epoch_seen) {
          epoch_seen = comm.epoch();
          std::printf("step %4d: epoch %llu, fenced links %s, ring %s\n", step,
                      static_cast<unsigned long long>(epoch_seen), fenced_text(comm.fenced_links()).c_str(),
                      join(comm.ring(), '-').c_str());
        }
        if (step % args.print_every == 0 || step == 1 || step == args.steps)
          std::printf("step %4d  loss %.6g\n", step, loss);
        std::fflush(stdout);
      }
    }
    if (csv) std::fclose(csv);

    // How many values missed the exact grid on any rank (0 in a healthy run).
    comm.allreduce(&unquantized, &unquantized, 1, ringfence::DataType::Uint64, ringfence::ReduceOp::Sum);
    if (rank == 0) {
      std::printf("summary [%s]: final loss %.9g after %d steps%s\n", args.label.c_str(), loss, args.steps,
                  first_bad_step > 0 ? (", first non-finite loss at step " + std::to_string(first_bad_step)).c_str()
                                     : "");
      std::printf("summary [%s]: epoch %llu, fenced links %s, ring %s, collectives %llu\n", args.label.c_str(),
                  static_cast<unsigned long long>(comm.epoch()), fenced_text(comm.fenced_links()).c_str(),
                  join(comm.ring(), '-').c_str(), static_cast<unsigned long long>(comm.sequence()));
      if (args.quantize)
        std::printf("summary [%s]: values outside the exact-sum grid: %llu\n", args.label.c_str(),
                    static_cast<unsigned long long>(unquantized));
      std::printf("links of rank 0:\n%s", comm.link_table().c_str());
      std::fflush(stdout);
    }
    comm.barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train: %s\n", e.what());
    return 1;
  }
}
