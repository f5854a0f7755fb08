// NCCL shim: collectives, point-to-point and groups over a ringfence Communicator
// (docs/nccl-compat.md). Host buffers with a NULL stream complete before the call returns;
// device or managed buffers, or any non-NULL stream, take ringfence's stream-ordered calls
// (docs/device.md); so do send/recv and ncclGather/ncclScatter (built from them) through
// ringfence's stream-ordered send/recv (one stream per group). Inside a group a call is queued and runs at the outermost ncclGroupEnd.
#include <fmt/format.h>

#include <cstddef>
#include <ringfence/error.hpp>

#include "shim.hpp"

namespace rf = ringfence;
using rf::nccl::ShimError;
using rf::nccl::bytes_of;
using rf::nccl::check_buffer;
using rf::nccl::check_rank_arg;
using rf::nccl::data_type;
using rf::nccl::reduce_op;

namespace {

using Run = std::function<void(rf::Communicator&)>;

// How a collective runs: on host memory with a NULL stream synchronously (the documented
// extension), else stream-ordered on `stream` (device or managed buffers, or any stream).
struct Mode {
  bool staged = false;
  rf::CudaStream stream;
};

// Checks the communicator, lets `prepare` check the arguments (it returns whether a buffer is
// CUDA memory) and build the call, then runs it now or queues it in this thread's group.
ncclResult_t submit(const char* call, ncclComm_t comm, cudaStream_t stream, const std::function<Run(ncclComm&, const Mode&)>& prepare) {
  const ncclResult_t r = rf::nccl::guarded(call, comm, [&] {
    ncclComm& c = rf::nccl::check_usable(call, comm);
    Run run = prepare(c, Mode{stream != nullptr, rf::CudaStream{stream}});
    if (rf::nccl::in_group()) {
      rf::nccl::PendingOp op;
      op.call = call;
      op.comm = &c;
      op.kind = rf::nccl::PendingOp::Kind::Collective;
      op.run = std::move(run);
      rf::nccl::enqueue(std::move(op));
    } else {
      run(rf::nccl::live(call, c));
    }
    return ncclSuccess;
  });
  if (r != ncclSuccess) rf::nccl::note_group_error(r);
  return r;
}

ncclResult_t point_to_point(const char* call, bool is_send, void* buf, std::size_t count, const ncclDataType_t& datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  const ncclResult_t r = rf::nccl::guarded(call, comm, [&] {
    ncclComm& c = rf::nccl::check_usable(call, comm);
    const rf::DataType t = data_type(call, datatype);
    // Device or managed memory, or any stream: stream-ordered (like the collectives).
    const bool staged = check_buffer(call, c, is_send ? "sendbuff" : "recvbuff", buf, bytes_of(call, "count", count, t)) || stream != nullptr;
    const rf::CudaStream s{stream};
    check_rank_arg(call, c, "peer", peer);
    if (rf::nccl::in_group()) {
      rf::nccl::PendingOp op;
      op.call = call;
      op.comm = &c;
      op.kind = is_send ? rf::nccl::PendingOp::Kind::Send : rf::nccl::PendingOp::Kind::Recv;
      op.send = buf;
      op.recv = buf;
      op.count = count;
      op.type = t;
      op.peer = peer;
      op.staged = staged;
      op.stream = s;
      rf::nccl::enqueue(std::move(op));
    } else {
      rf::nccl::transfer(rf::nccl::live(call, c), is_send, buf, count, t, peer, staged, s);
    }
    return ncclSuccess;
  });
  if (r != ncclSuccess) rf::nccl::note_group_error(r);
  return r;
}

// Send/recv as a call's mode says: host (NULL stream) or stream-ordered.
struct Transfers {
  rf::Communicator& rc;
  Mode m;
  void send(const void* buf, std::size_t count, rf::DataType t, int peer) const {
    rf::nccl::transfer(rc, true, const_cast<void*>(buf), count, t, peer, m.staged, m.stream);
  }
  void recv(void* buf, std::size_t count, rf::DataType t, int peer) const {
    rf::nccl::transfer(rc, false, buf, count, t, peer, m.staged, m.stream);
  }
};

const std::byte* at(const void* base, std::size_t offset) { return static_cast<const std::byte*>(base) + offset; }
std::byte* at(void* base, std::size_t offset) { return static_cast<std::byte*>(base) + offset; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                      ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclAllReduce";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const rf::ReduceOp o = reduce_op(call, op);
    const std::size_t bytes = bytes_of(call, "count", count, t);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);
    return [=](rf::Communicator& rc) { m.staged ? rc.allreduce(sendbuff, recvbuff, count, t, o, m.stream) : rc.allreduce(sendbuff, recvbuff, count, t, o); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclAllReduce,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                      ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclBroadcast";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const std::size_t bytes = bytes_of(call, "count", count, t);
    check_rank_arg(call, c, "root", root);
    if (c.rank == root) m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);  // read on the root only
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);
    return [=](rf::Communicator& rc) { m.staged ? rc.broadcast(sendbuff, recvbuff, count, t, root, m.stream) : rc.broadcast(sendbuff, recvbuff, count, t, root); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclBroadcast,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclBcast";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    check_rank_arg(call, c, "root", root);
    m.staged |= check_buffer(call, c, "buff", buff, bytes_of(call, "count", count, t));
    return [=](rf::Communicator& rc) { m.staged ? rc.broadcast(buff, buff, count, t, root, m.stream) : rc.broadcast(buff, buff, count, t, root); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclBcast,
                               (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                   int root, ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclReduce";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const rf::ReduceOp o = reduce_op(call, op);
    const std::size_t bytes = bytes_of(call, "count", count, t);
    check_rank_arg(call, c, "root", root);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);
    if (c.rank == root) m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);  // written on the root only
    return [=](rf::Communicator& rc) { m.staged ? rc.reduce(sendbuff, recvbuff, count, t, o, root, m.stream) : rc.reduce(sendbuff, recvbuff, count, t, o, root); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclReduce,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                int root, ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclAllGather";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const std::size_t bytes = bytes_of(call, "sendcount", sendcount, t);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes * static_cast<std::size_t>(c.size > 0 ? c.size : 1));
    return [=](rf::Communicator& rc) { m.staged ? rc.allgather(sendbuff, recvbuff, sendcount, t, m.stream) : rc.allgather(sendbuff, recvbuff, sendcount, t); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclAllGather,
                               (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                                cudaStream_t stream));

extern "C" ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclReduceScatter";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const rf::ReduceOp o = reduce_op(call, op);
    const std::size_t bytes = bytes_of(call, "recvcount", recvcount, t);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes * static_cast<std::size_t>(c.size > 0 ? c.size : 1));
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);
    return [=](rf::Communicator& rc) { m.staged ? rc.reduce_scatter(sendbuff, recvbuff, recvcount, t, o, m.stream) : rc.reduce_scatter(sendbuff, recvbuff, recvcount, t, o); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclReduceScatter,
                               (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                                ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  static constexpr const char* call = "ncclAlltoAll";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const std::size_t bytes = bytes_of(call, "count", count, t) * static_cast<std::size_t>(c.size > 0 ? c.size : 1);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);
    return [=](rf::Communicator& rc) { m.staged ? rc.alltoall(sendbuff, recvbuff, count, t, m.stream) : rc.alltoall(sendbuff, recvbuff, count, t); };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclAlltoAll,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                                cudaStream_t stream));

// Gather and scatter: one ringfence group of transfers to or from the root (the root's own block
// is copied by a transfer to itself, or left alone in place); stream-ordered like the other
// calls when a buffer is CUDA memory or the stream is not NULL.
extern "C" ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclGather";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const std::size_t bytes = bytes_of(call, "count", count, t);
    check_rank_arg(call, c, "root", root);
    m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes);
    if (c.rank == root) m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes * static_cast<std::size_t>(c.size > 0 ? c.size : 1));
    return [=](rf::Communicator& rc) {
      const int n = rc.size(), me = rc.rank();
      if (root < 0 || root >= n) throw ShimError(ncclInvalidArgument, fmt::format("rank {}: root {} is out of range [0, {})", me, root, n));
      const bool in_place = me == root && sendbuff == at(recvbuff, static_cast<std::size_t>(root) * bytes);
      Transfers x{rc, m};
      rc.group_start();
      if (!in_place) x.send(sendbuff, count, t, root);
      if (me == root)
        for (int r = 0; r < n; ++r)
          if (!(in_place && r == root)) x.recv(at(recvbuff, static_cast<std::size_t>(r) * bytes), count, t, r);
      rc.group_end();
    };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGather,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* call = "ncclScatter";
  return submit(call, comm, stream, [&](ncclComm& c, Mode m) -> Run {
    const rf::DataType t = data_type(call, datatype);
    const std::size_t bytes = bytes_of(call, "count", count, t);
    check_rank_arg(call, c, "root", root);
    if (c.rank == root) m.staged |= check_buffer(call, c, "sendbuff", sendbuff, bytes * static_cast<std::size_t>(c.size > 0 ? c.size : 1));
    m.staged |= check_buffer(call, c, "recvbuff", recvbuff, bytes);
    return [=](rf::Communicator& rc) {
      const int n = rc.size(), me = rc.rank();
      if (root < 0 || root >= n) throw ShimError(ncclInvalidArgument, fmt::format("rank {}: root {} is out of range [0, {})", me, root, n));
      const bool in_place = me == root && recvbuff == at(sendbuff, static_cast<std::size_t>(root) * bytes);
      Transfers x{rc, m};
      rc.group_start();
      if (me == root)
        for (int r = 0; r < n; ++r)
          if (!(in_place && r == root)) x.send(at(sendbuff, static_cast<std::size_t>(r) * bytes), count, t, r);
      if (!in_place) x.recv(recvbuff, count, t, root);
      rc.group_end();
    };
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclScatter,
                               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream));

// ---------------------------------------------------------------------------------------------
// Point-to-point and groups
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
  return point_to_point("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclSend,
                               (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                cudaStream_t stream));

extern "C" ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclRecv,
                               (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream));

extern "C" ncclResult_t ncclGroupStart() { return rf::nccl::group_start(); }
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGroupStart, ());

extern "C" ncclResult_t ncclGroupEnd() { return rf::nccl::group_end(); }
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGroupEnd, ());

extern "C" ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return rf::nccl::fail("ncclGroupSimulateEnd", nullptr, ncclInvalidUsage,
                        "not supported by the ringfence shim (the group stays open: end it with ncclGroupEnd)");
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));
