"""chorus as a torch.distributed backend.

    import chorus_torch                      # registers the backend "chorus"
    torch.distributed.init_process_group("chorus", rank=rank, world_size=world_size, ...)

Every torch.distributed call then runs on chorus: all_reduce, broadcast, reduce, all_gather,
reduce_scatter, all_to_all, gather, scatter, barrier, send and recv on CPU tensors, and
DistributedDataParallel on top of them. The ranks meet through torch.distributed's store.
"""
import torch.distributed as _dist

from ._C import create_process_group

BACKEND = "chorus"
if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, create_process_group)

__all__ = ["BACKEND", "create_process_group"]
