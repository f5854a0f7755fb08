"""ringfence as a torch.distributed backend.

    import ringfence_torch            # registers the "ringfence" backend
    torch.distributed.init_process_group(backend="ringfence")

Built against torch 1.13 (Debian 12 python3-torch); CPU tensors only. See docs/pytorch.md.
"""
import torch
import torch.distributed as dist

from . import _C  # noqa: E402  (needs torch's C++ types registered first)

__all__ = ["BACKEND", "fenced_links", "health_table"]

#: The name to pass to ``torch.distributed.init_process_group(backend=...)``.
BACKEND = "ringfence"


def _create(store, rank, world_size, timeout):
    """Creator torch calls from ``init_process_group`` / ``new_group`` (torch 1.13 signature)."""
    return _C.create_process_group(store, rank, world_size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)


def fenced_links(group=None):
    """Links the health layer fenced so far in ``group`` (default: the world), as (a, b) pairs."""
    return _C.fenced_links(group if group is not None else dist.distributed_c10d._get_default_group())


def health_table(group=None):
    """This rank's ring, fences, relays and link table for ``group`` (default: the world)."""
    return _C.health_table(group if group is not None else dist.distributed_c10d._get_default_group())
