#!/usr/bin/env python3
"""Every torch.distributed operation the ringfence backend implements, checked against values
each rank computes locally from the rank formula (no stored expectations). Run under torchrun;
prints "torch collectives: N checks passed, 0 failed" on rank 0 and exits 1 on any failure."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("RINGFENCE_TORCH_PATH", "build/python"))
import ringfence_torch  # noqa: E402,F401  (registers the backend)

failures = []
checks = 0


def check(name, cond):
    global checks
    checks += 1
    if not cond:
        failures.append(name)
        print(f"[rank {dist.get_rank()}] FAILED: {name}", file=sys.stderr, flush=True)


def expect_error(name, fn, text):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        check(f"{name} raises naming '{text}' (got: {e})", text in str(e))
        return
    check(f"{name} raises", False)


def contribution(rank, n, dtype):
    """Rank r's vector: r + 1 + i % 7 (exact in every dtype used here)."""
    return (torch.arange(n, dtype=torch.int64) % 7 + rank + 1).to(dtype)


def main():
    dist.init_process_group(backend="ringfence")
    rank, world = dist.get_rank(), dist.get_world_size()
    check("backend name", dist.get_backend() == "ringfence")
    n = 1000 + 3  # not a multiple of the world size or of a chunk

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.int8):
        contribs = [contribution(r, n, dtype) for r in range(world)]
        expected_sum = sum(c.to(torch.float64) for c in contribs)
        t = contribs[rank].clone()
        dist.all_reduce(t)
        check(f"all_reduce sum {dtype}", torch.equal(t.to(torch.float64), expected_sum))
        for op, ref in ((dist.ReduceOp.MAX, torch.stack(contribs).max(0).values),
                        (dist.ReduceOp.MIN, torch.stack(contribs).min(0).values)):
            t = contribs[rank].clone()
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dtype}", torch.equal(t, ref))

    f = contribution(rank, n, torch.float64)
    t = f.clone()
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    prod = torch.ones(n, dtype=torch.float64)
    for r in range(world):
        prod *= contribution(r, n, torch.float64)
    check("all_reduce product", torch.equal(t, prod))

    # async allreduce + future (what DDP uses)
    t = contribution(rank, n, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    check("async all_reduce future value", torch.equal(fut.value()[0], t))
    check("async all_reduce result", torch.equal(t.double(), sum(contribution(r, n, torch.float64) for r in range(world))))

    for root in range(world):
        t = contribution(rank, n, torch.float32)
        dist.broadcast(t, src=root)
        check(f"broadcast root {root}", torch.equal(t, contribution(root, n, torch.float32)))

        t = contribution(rank, n, torch.int64)
        dist.reduce(t, dst=root)
        if rank == root:
            check(f"reduce root {root}", torch.equal(t, sum(contribution(r, n, torch.int64) for r in range(world))))
        else:
            check(f"reduce root {root} leaves non-root input", torch.equal(t, contribution(rank, n, torch.int64)))

    outs = [torch.empty(n, dtype=torch.float32) for _ in range(world)]
    dist.all_gather(outs, contribution(rank, n, torch.float32))
    check("all_gather", all(torch.equal(outs[r], contribution(r, n, torch.float32)) for r in range(world)))

    big = torch.empty(world * n, dtype=torch.int32)
    dist.all_gather_into_tensor(big, contribution(rank, n, torch.int32))
    check("all_gather_into_tensor", torch.equal(big, torch.cat([contribution(r, n, torch.int32) for r in range(world)])))

    # reduce_scatter: rank r's input block j is contribution(r, n) * (j + 1)
    ins = [contribution(rank, n, torch.float64) * (j + 1) for j in range(world)]
    out = torch.empty(n, dtype=torch.float64)
    dist.reduce_scatter(out, ins)
    check("reduce_scatter", torch.equal(out, sum(contribution(r, n, torch.float64) for r in range(world)) * (rank + 1)))
    out2 = torch.empty(n, dtype=torch.float64)
    dist.reduce_scatter_tensor(out2, torch.cat(ins))
    check("reduce_scatter_tensor", torch.equal(out2, out))

    # alltoall_base, equal splits: block j of rank r holds 100 * r + j
    m = 5
    inp = torch.cat([torch.full((m,), 100 * rank + j, dtype=torch.int64) for j in range(world)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    check("all_to_all_single even", torch.equal(out, torch.cat([torch.full((m,), 100 * r + rank, dtype=torch.int64)
                                                               for r in range(world)])))
    # uneven splits: rank r sends (r + j + 1) rows of 3 to rank j
    in_splits = [rank + j + 1 for j in range(world)]
    out_splits = [r + rank + 1 for r in range(world)]
    inp = torch.cat([torch.full((in_splits[j], 3), 1000 * rank + j, dtype=torch.float32) for j in range(world)])
    out = torch.empty(sum(out_splits), 3, dtype=torch.float32)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    check("all_to_all_single uneven", torch.equal(out, torch.cat([torch.full((out_splits[r], 3), 1000 * r + rank,
                                                                             dtype=torch.float32)
                                                                  for r in range(world)])))

    # send/recv: a ring shift, blocking (even ranks send first) and with batch_isend_irecv
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    mine = contribution(rank, n, torch.float32)
    got = torch.empty(n, dtype=torch.float32)
    if rank % 2 == 0:
        dist.send(mine, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(mine, nxt)
    if world % 2 == 0:
        check("send/recv ring", torch.equal(got, contribution(prv, n, torch.float32)))
    large = 4 << 20  # 16 MiB of float32: needs the peer to receive while we send
    mine = contribution(rank, large, torch.float32)
    got = torch.empty(large, dtype=torch.float32)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)])
    for r in reqs:
        r.wait()
    check("batch_isend_irecv ring 16 MiB", torch.equal(got, contribution(prv, large, torch.float32)))

    # gather, scatter, list all_to_all, all_gather_coalesced: checked against the rank formula and
    # against the same call on a gloo group of the same ranks.
    gloo = dist.new_group(backend="gloo")

    def both(fn):
        """fn(group) -> tensors; returns (ringfence's, gloo's)."""
        return fn(None), fn(gloo)

    for root in range(world):
        def do_gather(group, root=root):
            outs = [torch.empty(n, dtype=torch.float32) for _ in range(world)] if rank == root else None
            dist.gather(contribution(rank, n, torch.float32), gather_list=outs, dst=root, group=group)
            return outs
        rf_g, gl_g = both(do_gather)
        if rank == root:
            check(f"gather root {root}", all(torch.equal(rf_g[r], contribution(r, n, torch.float32)) for r in range(world)))
            check(f"gather root {root} matches gloo", all(torch.equal(a, b) for a, b in zip(rf_g, gl_g)))

        def do_scatter(group, root=root):
            out = torch.empty(n, dtype=torch.int64)
            ins = [contribution(r, n, torch.int64) * 3 for r in range(world)] if rank == root else None
            dist.scatter(out, scatter_list=ins, src=root, group=group)
            return out
        rf_s, gl_s = both(do_scatter)
        check(f"scatter root {root}", torch.equal(rf_s, contribution(rank, n, torch.int64) * 3))
        check(f"scatter root {root} matches gloo", torch.equal(rf_s, gl_s))

    # list all_to_all, a different size for every pair: rank r sends (r + j + 1) * 2 values to j.
    # Gloo (torch 1.13) has no list all_to_all: its reference is all_to_all_single with the same
    # splits, cut into the same blocks.
    def do_all_to_all(group):
        ins = [torch.full(((rank + j + 1) * 2,), 1000 * rank + j, dtype=torch.int32) for j in range(world)]
        sizes = [(r + rank + 1) * 2 for r in range(world)]
        if group is None:
            outs = [torch.empty((k,), dtype=torch.int32) for k in sizes]
            dist.all_to_all(outs, ins)
            return outs
        out = torch.empty((sum(sizes),), dtype=torch.int32)
        dist.all_to_all_single(out, torch.cat(ins), output_split_sizes=sizes, input_split_sizes=[t.numel() for t in ins],
                               group=group)
        return list(out.split(sizes))
    rf_a, gl_a = both(do_all_to_all)
    check("all_to_all list uneven", all(torch.equal(rf_a[r], torch.full(((r + rank + 1) * 2,), 1000 * r + rank,
                                                                        dtype=torch.int32)) for r in range(world)))
    check("all_to_all list matches gloo", all(torch.equal(a, b) for a, b in zip(rf_a, gl_a)))

    def do_coalesced(group):
        ins = [contribution(rank, 7, torch.float64), contribution(rank, n, torch.float64) * 2]
        outs = [[torch.empty(7, dtype=torch.float64), torch.empty(n, dtype=torch.float64)] for _ in range(world)]
        dist.all_gather_coalesced(outs, ins, group=group)
        return outs
    rf_c, gl_c = both(do_coalesced)
    check("all_gather_coalesced", all(torch.equal(rf_c[r][0], contribution(r, 7, torch.float64)) and
                                      torch.equal(rf_c[r][1], contribution(r, n, torch.float64) * 2) for r in range(world)))
    check("all_gather_coalesced matches gloo", all(torch.equal(a, b) for x, y in zip(rf_c, gl_c) for a, b in zip(x, y)))

    # torch 1.13's dist.monitored_barrier refuses every backend but gloo in Python; the process
    # group's own method is what it would call.
    from datetime import timedelta
    dist.distributed_c10d._get_default_group().monitored_barrier(timedelta(seconds=30))
    check("monitored_barrier", True)
    expect_error("all_to_all list of the wrong length",
                 lambda: dist.all_to_all([torch.zeros(1)] * (world + 1), [torch.zeros(1)] * (world + 1)),
                 "one input and one output tensor per rank")

    dist.barrier()
    check("barrier", True)

    # argument errors name the problem
    expect_error("non-contiguous tensor", lambda: dist.all_reduce(torch.zeros(4, 4).t()), "contiguous")
    expect_error("send tag", lambda: dist.send(torch.zeros(2), nxt, tag=5), "tags are not supported")
    expect_error("bitwise op", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
                 "not supported")
    expect_error("int16 dtype", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)), "unsupported tensor dtype")

    ok = torch.tensor([len(failures)], dtype=torch.int64)
    dist.all_reduce(ok)
    if rank == 0:
        print(f"torch collectives: {checks} checks passed, {int(ok.item())} failed" if ok.item() == 0 else
              f"torch collectives: {int(ok.item())} checks failed", flush=True)
    dist.destroy_process_group()
    return 0 if ok.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
