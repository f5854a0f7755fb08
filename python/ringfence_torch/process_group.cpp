// ringfence as a torch.distributed backend (torch 1.13 `c10d::ProcessGroup` API).
//
// One translation unit on purpose: the torch headers are heavy, so everything torch-facing
// (store adapter and work in torch_support.hpp, process group, Python bindings) compiles once.
// See docs/pytorch.md.

#include <torch/extension.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <ringfence/ringfence.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "torch_support.hpp"

namespace ringfence::torch_backend {

/// `torch.distributed` process group running every operation on a ringfence `Communicator`.
/// Operations are queued in issue order and run, one at a time, on one worker thread per
/// group (the communicator is single-threaded); each returns a `RingfenceWork`.
class ProcessGroupRingfence final : public c10d::ProcessGroup {
 public:
  /// Joins the group: builds the communicator through `store` (blocks until every rank's links
  /// are up or the timeout passed). The per-operation timeout is `RINGFENCE_TIMEOUT_MS` when set,
  /// else torch's `timeout`.
  ProcessGroupRingfence(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::chrono::milliseconds timeout)
      : c10d::ProcessGroup(rank, size), comm_(make_comm(store, rank, size, timeout)) {
    worker_ = std::thread([this] { run(); });
    init();
  }

  ~ProcessGroupRingfence() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  /// "ringfence".
  const std::string getBackendName() const override { return "ringfence"; }

  /// In-place broadcast of one tensor from `opts.rootRank`.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast tensor");
    check_root(opts.rootRank);
    TORCH_CHECK(opts.rootTensor == 0, "ringfence: broadcast rootTensor must be 0");
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::BROADCAST, "ringfence:broadcast", {t}, [t, root](Communicator& c) {
      c.broadcast(t.data_ptr(), t.data_ptr(), count(t), to_rf(t.scalar_type()), root);
    });
  }

  /// In-place allreduce of one tensor.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = single(tensors, "allreduce tensor");
    const ReduceOp op = to_rf(opts.reduceOp, t.scalar_type());
    return enqueue(c10d::OpType::ALLREDUCE, "ringfence:allreduce", {t}, [t, op](Communicator& c) {
      c.allreduce(t.data_ptr(), t.data_ptr(), count(t), to_rf(t.scalar_type()), op);
    });
  }

  /// In-place allreduce of each tensor (one collective per tensor).
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "ringfence: allreduce_coalesced needs at least one tensor");
    std::vector<ReduceOp> ops;
    for (const auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced tensor");
      ops.push_back(to_rf(opts.reduceOp, t.scalar_type()));
    }
    std::vector<at::Tensor> ts = tensors;
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "ringfence:allreduce_coalesced", ts, [ts, ops](Communicator& c) {
      for (std::size_t i = 0; i < ts.size(); ++i)
        c.allreduce(ts[i].data_ptr(), ts[i].data_ptr(), count(ts[i]), to_rf(ts[i].scalar_type()), ops[i]);
    });
  }

  /// In-place reduce to `opts.rootRank` (other ranks' tensors are left unchanged).
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce tensor");
    check_root(opts.rootRank);
    TORCH_CHECK(opts.rootTensor == 0, "ringfence: reduce rootTensor must be 0");
    const ReduceOp op = to_rf(opts.reduceOp, t.scalar_type());
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::REDUCE, "ringfence:reduce", {t}, [t, op, root](Communicator& c) {
      c.reduce(t.data_ptr(), t.data_ptr(), count(t), to_rf(t.scalar_type()), op, root);
    });
  }

  /// Allgather into a list of `size()` tensors (gathered into one buffer, then copied out).
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor in = single(inputs, "allgather input");
    TORCH_CHECK(outputs.size() == 1, "ringfence: allgather takes one output list per process");
    std::vector<at::Tensor> outs = outputs[0];
    TORCH_CHECK(static_cast<int>(outs.size()) == size_, "ringfence: allgather output list has ", outs.size(),
                " tensors, expected the group size ", size_);
    for (const auto& o : outs) {
      check_tensor(o, "allgather output");
      same_shape(in, o, "allgather output");
    }
    return enqueue(c10d::OpType::ALLGATHER, "ringfence:allgather", outs, [in, outs](Communicator& c) {
      at::Tensor flat = at::empty({static_cast<std::int64_t>(outs.size()) * in.numel()}, in.options());
      c.allgather(in.data_ptr(), flat.data_ptr(), count(in), to_rf(in.scalar_type()));
      for (std::size_t r = 0; r < outs.size(); ++r)
        outs[r].view({-1}).copy_(flat.narrow(0, static_cast<std::int64_t>(r) * in.numel(), in.numel()));
    });
  }

  /// Allgather into one tensor of `size()` blocks (no copies).
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    check_tensor(input, "allgather input");
    check_tensor(output, "allgather output");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ringfence: allgather output dtype differs from input");
    TORCH_CHECK(output.numel() == input.numel() * size_, "ringfence: allgather output has ", output.numel(),
                " elements, expected ", input.numel() * size_);
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_ALLGATHER_BASE, "ringfence:_allgather_base", {out}, [in, out](Communicator& c) {
      c.allgather(in.data_ptr(), out.data_ptr(), count(in), to_rf(in.scalar_type()));
    });
  }

  /// Reduce-scatter of a list of `size()` inputs (packed into one buffer first).
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "reduce_scatter output");
    TORCH_CHECK(inputs.size() == 1, "ringfence: reduce_scatter takes one input list per process");
    std::vector<at::Tensor> ins = inputs[0];
    TORCH_CHECK(static_cast<int>(ins.size()) == size_, "ringfence: reduce_scatter input list has ", ins.size(),
                " tensors, expected the group size ", size_);
    for (const auto& i : ins) {
      check_tensor(i, "reduce_scatter input");
      same_shape(out, i, "reduce_scatter input");
    }
    const ReduceOp op = to_rf(opts.reduceOp, out.scalar_type());
    return enqueue(c10d::OpType::REDUCE_SCATTER, "ringfence:reduce_scatter", {out}, [out, ins, op](Communicator& c) {
      std::vector<at::Tensor> flat_views;
      for (const auto& i : ins) flat_views.push_back(i.view({-1}));
      at::Tensor flat = at::cat(flat_views);
      c.reduce_scatter(flat.data_ptr(), out.data_ptr(), count(out), to_rf(out.scalar_type()), op);
    });
  }

  /// Reduce-scatter of one tensor of `size()` blocks (no copies).
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_tensor(input, "reduce_scatter input");
    check_tensor(output, "reduce_scatter output");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ringfence: reduce_scatter output dtype differs from input");
    TORCH_CHECK(input.numel() == output.numel() * size_, "ringfence: reduce_scatter input has ", input.numel(),
                " elements, expected ", output.numel() * size_);
    const ReduceOp op = to_rf(opts.reduceOp, output.scalar_type());
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "ringfence:_reduce_scatter_base", {out},
                   [in, out, op](Communicator& c) {
                     c.reduce_scatter(in.data_ptr(), out.data_ptr(), count(out), to_rf(out.scalar_type()), op);
                   });
  }

  /// All-to-all along dimension 0: equal splits run `Communicator::alltoall`; uneven splits
  /// (`output_split_sizes` / `input_split_sizes`, rows of dimension 0) run one group of
  /// send/recv pairs.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    check_tensor(input, "alltoall input");
    check_tensor(output, "alltoall output");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ringfence: alltoall output dtype differs from input");
    at::Tensor in = input, out = output;
    if (output_splits.empty() && input_splits.empty()) {
      TORCH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0, "ringfence: alltoall needs input and output of ",
                  "the same size, divisible by the group size ", size_, " (got ", in.numel(), " and ", out.numel(), ")");
      return enqueue(c10d::OpType::ALLTOALL_BASE, "ringfence:alltoall_base", {out}, [in, out, n = size_](Communicator& c) {
        c.alltoall(in.data_ptr(), out.data_ptr(), count(in) / n, to_rf(in.scalar_type()));
      });
    }
    const auto in_off = offsets(in, input_splits, "input");
    const auto out_off = offsets(out, output_splits, "output");
    return enqueue(c10d::OpType::ALLTOALL_BASE, "ringfence:alltoall_base", {out},
                   [in, out, in_off, out_off, n = size_](Communicator& c) {
                     const std::size_t es = in.element_size();
                     const DataType dt = to_rf(in.scalar_type());
                     auto* src = static_cast<const char*>(in.data_ptr());
                     auto* dst = static_cast<char*>(out.data_ptr());
                     c.group_start();
                     for (int j = 0; j < n; ++j) {
                       if (const std::size_t k = in_off[j + 1] - in_off[j]) c.send(src + in_off[j] * es, k, dt, j);
                       if (const std::size_t k = out_off[j + 1] - out_off[j]) c.recv(dst + out_off[j] * es, k, dt, j);
                     }
                     c.group_end();
                   });
  }

  /// All-to-all of tensor lists: `inputs[j]` goes to rank j, `outputs[r]` comes from rank r; the
  /// tensors may differ in size from peer to peer (one dtype). One group of send/recv pairs; our
  /// own block is copied.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                "ringfence: alltoall takes one input and one output tensor per rank (group size ", size_, ", got ",
                inputs.size(), " inputs and ", outputs.size(), " outputs)");
    for (int j = 0; j < size_; ++j) {
      check_tensor(inputs[j], "alltoall input");
      check_tensor(outputs[j], "alltoall output");
      TORCH_CHECK(inputs[j].scalar_type() == inputs[0].scalar_type() && outputs[j].scalar_type() == inputs[0].scalar_type(),
                  "ringfence: alltoall tensors must share one dtype (", inputs[0].scalar_type(), ")");
    }
    TORCH_CHECK(outputs[rank_].numel() == inputs[rank_].numel(), "ringfence: alltoall output ", rank_, " has ",
                outputs[rank_].numel(), " elements, our own input block ", inputs[rank_].numel());
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(c10d::OpType::ALLTOALL, "ringfence:alltoall", outs, [ins, outs, me = rank_, n = size_](Communicator& c) {
      c.group_start();
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        if (ins[j].numel() > 0) c.send(ins[j].data_ptr(), count(ins[j]), to_rf(ins[j].scalar_type()), j);
        if (outs[j].numel() > 0) c.recv(outs[j].data_ptr(), count(outs[j]), to_rf(outs[j].scalar_type()), j);
      }
      c.group_end();
      outs[me].copy_(ins[me]);
    });
  }

  /// Gather to `opts.rootRank`: the root's `outputs[0]` holds one tensor per rank; other ranks
  /// pass no outputs. One group of transfers to the root.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor in = single(inputs, "gather input");
    check_root(opts.rootRank);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs = root_list(outputs, root, in, "gather output");
    return enqueue(c10d::OpType::GATHER, "ringfence:gather", outs, [in, outs, root, me = rank_, n = size_](Communicator& c) {
      if (me != root) return c.send(in.data_ptr(), count(in), to_rf(in.scalar_type()), root);
      c.group_start();
      for (int r = 0; r < n; ++r)
        if (r != root) c.recv(outs[r].data_ptr(), count(outs[r]), to_rf(outs[r].scalar_type()), r);
      c.group_end();
      outs[root].copy_(in);
    });
  }

  /// Scatter from `opts.rootRank`: the root's `inputs[0]` holds one tensor per rank; other ranks
  /// pass no inputs. One group of transfers from the root.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "scatter output");
    check_root(opts.rootRank);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> ins = root_list(inputs, root, out, "scatter input");
    return enqueue(c10d::OpType::SCATTER, "ringfence:scatter", {out}, [ins, out, root, me = rank_, n = size_](Communicator& c) {
      if (me != root) return c.recv(out.data_ptr(), count(out), to_rf(out.scalar_type()), root);
      c.group_start();
      for (int r = 0; r < n; ++r)
        if (r != root) c.send(ins[r].data_ptr(), count(ins[r]), to_rf(ins[r].scalar_type()), r);
      c.group_end();
      out.copy_(ins[root]);
    });
  }

  /// Allgather of several tensors at once: `outputs[r][i]` becomes rank r's `inputs[i]` (one
  /// allgather per tensor, in order).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    TORCH_CHECK(!inputs.empty(), "ringfence: allgather_coalesced needs at least one input tensor");
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "ringfence: allgather_coalesced takes one output list per rank (",
                size_, "), got ", outputs.size());
    for (const auto& list : outputs) {
      TORCH_CHECK(list.size() == inputs.size(), "ringfence: allgather_coalesced output lists need ", inputs.size(),
                  " tensors (one per input), got ", list.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        check_tensor(list[i], "allgather_coalesced output");
        same_shape(inputs[i], list[i], "allgather_coalesced output");
      }
    }
    for (const auto& in : inputs) check_tensor(in, "allgather_coalesced input");
    std::vector<at::Tensor> ins = inputs, flat_outs;
    for (const auto& list : outputs) flat_outs.insert(flat_outs.end(), list.begin(), list.end());
    auto lists = outputs;
    return enqueue(c10d::OpType::ALLGATHER_COALESCED, "ringfence:allgather_coalesced", flat_outs, [ins, lists](Communicator& c) {
      for (std::size_t i = 0; i < ins.size(); ++i) {
        const at::Tensor& in = ins[i];
        at::Tensor flat = at::empty({static_cast<std::int64_t>(lists.size()) * in.numel()}, in.options());
        c.allgather(in.data_ptr(), flat.data_ptr(), count(in), to_rf(in.scalar_type()));
        for (std::size_t r = 0; r < lists.size(); ++r)
          lists[r][i].view({-1}).copy_(flat.narrow(0, static_cast<std::int64_t>(r) * in.numel(), in.numel()));
      }
    });
  }

  /// A barrier that fails, instead of hanging, when a rank does not arrive within `opts.timeout`
  /// (torch's default: the group's timeout): the error names the ranks that did not reach it as
  /// far as this rank can tell (its ring neighbours' links), not every missing rank as gloo's
  /// `wait_all_ranks=True` does.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) override {
    const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout);
    on_worker([limit](Communicator& c) {
      c.set_timeout(limit.count() > 0 ? limit : std::chrono::milliseconds(0));  // 0: the group's own
      try {
        c.barrier();
      } catch (...) {
        c.set_timeout(std::chrono::milliseconds(0));
        throw;
      }
      c.set_timeout(std::chrono::milliseconds(0));
      return 0;
    });
  }

  /// Sends one tensor to `dst`. Tags are not supported (must be 0): messages between two ranks
  /// match in call order. Inside `batch_isend_irecv` (coalescing) the sends and receives run as
  /// one ringfence group, so any exchange pattern completes.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const at::Tensor t = single(tensors, "send tensor");
    check_peer(dst, tag);
    return p2p(c10d::OpType::SEND, "ringfence:send", t, [t, dst](Communicator& c) {
      c.send(t.data_ptr(), count(t), to_rf(t.scalar_type()), dst);
    });
  }

  /// Receives one tensor from `src`. See `send`.
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    const at::Tensor t = single(tensors, "recv tensor");
    check_peer(src, tag);
    return p2p(c10d::OpType::RECV, "ringfence:recv", t, [t, src](Communicator& c) {
      c.recv(t.data_ptr(), count(t), to_rf(t.scalar_type()), src);
    });
  }

  /// Barrier over the group.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(c10d::OpType::BARRIER, "ringfence:barrier", {}, [](Communicator& c) { c.barrier(); });
  }

  /// Starts collecting send/recv calls (torch's `batch_isend_irecv`).
  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!coalescing_, "ringfence: startCoalescing called twice");
    coalescing_ = true;
  }

  /// Runs the collected send/recv calls as one ringfence group.
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*reqs*/) override {
    std::vector<Task> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(coalescing_, "ringfence: endCoalescing without startCoalescing");
      coalescing_ = false;
      batch.swap(batch_);
    }
    if (batch.empty()) return;
    std::vector<c10::intrusive_ptr<RingfenceWork>> works;
    std::vector<std::function<void(Communicator&)>> fns;
    for (auto& t : batch) {
      works.push_back(t.work);
      fns.push_back(std::move(t.fn));
    }
    push(Task{c10::intrusive_ptr<RingfenceWork>(),
              [fns](Communicator& c) {
                c.group_start();
                for (const auto& f : fns) f(c);
                c.group_end();
              },
              works});
  }

  /// Runs `fn` on the worker (after every queued operation) and returns its result.
  template <class F>
  auto on_worker(F fn) -> decltype(fn(std::declval<Communicator&>())) {
    using R = decltype(fn(std::declval<Communicator&>()));
    std::mutex m;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<R> result;
    std::exception_ptr error;
    push(Task{c10::intrusive_ptr<RingfenceWork>(),
              [&](Communicator& c) {
                try {
                  result.emplace(fn(c));
                } catch (...) {
                  error = std::current_exception();
                }
                std::lock_guard<std::mutex> l(m);
                done = true;
                done_cv.notify_all();
              },
              {}});
    std::unique_lock<std::mutex> l(m);
    done_cv.wait(l, [&] { return done; });
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }

 private:
  struct Task {
    c10::intrusive_ptr<RingfenceWork> work;  // null for batches and internal tasks
    std::function<void(Communicator&)> fn;
    std::vector<c10::intrusive_ptr<RingfenceWork>> batch_works;  // completed together
  };

  static Communicator make_comm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                std::chrono::milliseconds timeout) {
    TORCH_CHECK(store, "ringfence: null store");
    const Environment env = Environment::from_process();
    CommOptions options = CommOptions::from_env(env);
    if (!env.has("RINGFENCE_TIMEOUT_MS") && timeout.count() > 0) options.timeout = timeout;
    // On every rank, as Communicator::from_env does.
    TransportRegistry transports = builtin_transports();
    warn_unknown_variables(make_logger(options.log_level, rank, options.log_file, options.log_timestamps), env,
                           transports.setting_variables(), "torch backend: ");
    return Communicator(std::make_shared<C10dStore>(store), rank, size, std::move(transports), options);
  }

  void check_root(int64_t root) const {
    TORCH_CHECK(root >= 0 && root < size_, "ringfence: root rank ", root, " out of range [0, ", size_, ")");
  }
  void check_peer(int peer, int tag) const {
    TORCH_CHECK(peer >= 0 && peer < size_, "ringfence: peer rank ", peer, " out of range [0, ", size_, ")");
    TORCH_CHECK(tag == 0, "ringfence: send/recv tags are not supported (got tag ", tag,
                "); messages between two ranks match in call order");
  }

  // The root's list of one tensor per rank (each like `like`: dtype and size), or nothing on
  // other ranks: torch passes `[[t0, ..., tn-1]]` on the root and `[]` (or `[[]]`) elsewhere.
  std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, int root, const at::Tensor& like,
                                    const char* what) const {
    if (rank_ != root) {
      TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "ringfence: ", what,
                  " list must be empty on non-root rank ", rank_);
      return {};
    }
    TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size_, "ringfence: ", what,
                " list on the root must hold one tensor per rank (", size_, ")");
    for (const auto& t : lists[0]) {
      check_tensor(t, what);
      same_shape(like, t, what);
    }
    return lists[0];
  }

  // Element offsets of the `size_` row blocks of `t` along dim 0 (size_ + 1 entries).
  std::vector<std::size_t> offsets(const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) const {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_elems = rows == 0 ? 0 : t.numel() / rows;
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "ringfence: alltoall ", what, " has ", rows, " rows, not divisible by ", size_);
      s.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == size_, "ringfence: alltoall ", what, " split sizes have ", s.size(),
                " entries, expected ", size_);
    std::vector<std::size_t> off(size_ + 1, 0);
    int64_t total = 0;
    for (int j = 0; j < size_; ++j) {
      TORCH_CHECK(s[j] >= 0, "ringfence: alltoall ", what, " split size ", s[j], " is negative");
      total += s[j];
      off[j + 1] = static_cast<std::size_t>(total * row_elems);
    }
    TORCH_CHECK(total == rows, "ringfence: alltoall ", what, " split sizes sum to ", total, ", the tensor has ", rows,
                " rows");
    return off;
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                         std::function<void(Communicator&)> fn) {
    auto work = c10::make_intrusive<RingfenceWork>(rank_, type, title, std::move(outputs));
    push(Task{work, std::move(fn), {}});
    return work;
  }

  c10::intrusive_ptr<c10d::Work> p2p(c10d::OpType type, const char* title, const at::Tensor& t,
                                     std::function<void(Communicator&)> fn) {
    auto work = c10::make_intrusive<RingfenceWork>(rank_, type, title, std::vector<at::Tensor>{t});
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (coalescing_) {
        batch_.push_back(Task{work, std::move(fn), {}});
        return work;
      }
    }
    push(Task{work, std::move(fn), {}});
    return work;
  }

  void push(Task task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stop_, "ringfence: process group is shutting down");
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }

  void run() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        task.fn(comm_);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(std::runtime_error(std::string("ringfence: ") + e.what()));
      } catch (...) {
        error = std::current_exception();
      }
      if (task.work) task.work->complete(error);
      for (auto& w : task.batch_works) w->complete(error);
    }
  }

  Communicator comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  bool coalescing_ = false;
  std::vector<Task> batch_;
  std::thread worker_;
};

namespace {

ProcessGroupRingfence& as_ringfence(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  auto* p = dynamic_cast<ProcessGroupRingfence*>(pg.get());
  TORCH_CHECK(p != nullptr, "ringfence: not a ringfence process group (backend ",
              pg ? pg->getBackendName() : std::string("null"), ")");
  return *p;
}

c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupRingfence>(store, rank, size, timeout);
}

}  // namespace
}  // namespace ringfence::torch_backend

PYBIND11_MODULE(_C, m) {
  namespace tb = ringfence::torch_backend;
  m.doc() = "ringfence torch.distributed backend (C++ part); import ringfence_torch instead";
  m.def("create_process_group", &tb::create, pybind11::arg("store"), pybind11::arg("rank"),
        pybind11::arg("world_size"), pybind11::arg("timeout"), pybind11::call_guard<pybind11::gil_scoped_release>(),
        "Creates a ringfence process group (the creator registered with torch.distributed.Backend).");
  m.def(
      "fenced_links",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        std::vector<std::pair<int, int>> out;
        for (const auto& l : tb::as_ringfence(pg).on_worker([](ringfence::Communicator& c) { return c.fenced_links(); }))
          out.emplace_back(l.a, l.b);
        return out;
      },
      pybind11::call_guard<pybind11::gil_scoped_release>(),
      "Links fenced so far (agreed by every rank), as (a, b) rank pairs, after every queued operation.");
  m.def(
      "health_table",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        return tb::as_ringfence(pg).on_worker([](ringfence::Communicator& c) { return c.health().table(); });
      },
      pybind11::call_guard<pybind11::gil_scoped_release>(),
      "Ring, fences, relays and the link table of this rank, after every queued operation.");
}
