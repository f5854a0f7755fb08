#!/usr/bin/env python3
"""One exact allreduce on the ringfence backend, run with a misspelt RINGFENCE_* variable beside
a transport's own (env_typo_test.sh checks the warnings). Prints "torch env: allreduce exact" on
rank 0; exits 1 when the result is wrong."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("RINGFENCE_TORCH_PATH", "build/python"))
import ringfence_torch  # noqa: E402,F401  (registers the backend)


def main():
    dist.init_process_group(backend="ringfence")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1003,), float(rank + 1))
    dist.all_reduce(t)
    exact = bool((t == world * (world + 1) / 2).all())
    dist.destroy_process_group()
    if not exact:
        print(f"[rank {rank}] allreduce result wrong", file=sys.stderr, flush=True)
        sys.exit(1)
    if rank == 0:
        print("torch env: allreduce exact", flush=True)


if __name__ == "__main__":
    main()
