#!/usr/bin/env python3
"""DistributedDataParallel training of a small MLP on synthetic data, under torchrun.

    torchrun --standalone --nproc_per_node=4 --redirects 2 --tee 2 examples/torch_ddp.py \
        --backend ringfence --steps 20 --out /tmp/rf.pt

The same script runs with ``--backend gloo`` for comparison. Rank 0 prints the step times, a
digest of the final parameters and (ringfence) the fenced links and its health table, and
saves the final parameters to ``--out``. Every rank checks that its parameters equal rank 0's.
The ringfence backend is the ``ringfence_torch`` package from the build tree
(``build/python``; set PYTHONPATH or RINGFENCE_TORCH_PATH to use another one).
See docs/pytorch.md.
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def import_backend():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("RINGFENCE_TORCH_PATH"), os.path.join(here, "..", "build", "python")]
    try:
        import ringfence_torch  # noqa: F401
        return ringfence_torch
    except ImportError:
        for c in candidates:
            if c and os.path.isdir(os.path.join(c, "ringfence_torch")):
                sys.path.insert(0, c)
                import ringfence_torch  # noqa: F811
                return ringfence_torch
        raise


def make_model(dim, hidden):
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, 1))


def batch(seed, rank, step, size, dim):
    """Synthetic regression data, different on every rank and step, identical across backends."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(size, dim, generator=g)
    y = torch.sin(x[:, :1] * 3) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ringfence", help="ringfence or gloo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--out", help="rank 0 saves the final parameters here (torch.save of a dict)")
    args = ap.parse_args()

    if args.backend == "ringfence":
        rf = import_backend()
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.set_num_threads(1)  # 2-core CI machines run 4 ranks
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's initial parameters anyway
    model = DDP(make_model(args.dim, args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    times, losses = [], []
    for step in range(args.steps):
        x, y = batch(args.seed, rank, step, args.batch, args.dim)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP's allreduce of the gradient bucket(s) completes inside
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    agree = torch.equal(ref, flat)
    ok = torch.tensor([1 if agree else 0], dtype=torch.int64)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)

    if rank == 0:
        steady = times[1:] if len(times) > 1 else times
        print(f"torch_ddp: backend={args.backend} world={world} steps={args.steps} params={flat.numel()} "
              f"dtype={args.dtype}", flush=True)
        print(f"torch_ddp: loss first={losses[0]:.6f} last={losses[-1]:.6f}", flush=True)
        print(f"torch_ddp: step_ms median={statistics.median(steady) * 1e3:.3f} "
              f"mean={statistics.mean(steady) * 1e3:.3f} min={min(steady) * 1e3:.3f} (steps 2..{len(times)})",
              flush=True)
        print(f"torch_ddp: params sha256={hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]}", flush=True)
        print(f"torch_ddp: every rank has rank 0's parameters: {bool(ok.item())}", flush=True)
        if args.out:
            torch.save({n: p.detach().clone() for n, p in model.module.named_parameters()}, args.out)
    if args.backend == "ringfence":
        fenced = rf.fenced_links()
        if rank == 0:
            print(f"torch_ddp: fenced links {fenced}", flush=True)
            print(rf.health_table(), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
