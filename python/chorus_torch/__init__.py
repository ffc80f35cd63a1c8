"""chorus as a torch.distributed backend.

    import chorus_torch                      # registers the backend "chorus"
    torch.distributed.init_process_group("chorus", rank=rank, world_size=world_size, ...)

Every torch.distributed call then runs on chorus: all_reduce, broadcast, reduce, all_gather,
reduce_scatter, all_to_all, gather, scatter, barrier, send and recv on CPU tensors, and on CUDA
tensors where this module was built against a PyTorch 2 with CUDA (`chorus_torch.CUDA`), enqueued
on the current stream; DistributedDataParallel on top of them. The ranks meet through
torch.distributed's store.
"""
import torch
import torch.distributed as _dist

from ._C import create_process_group
from ._C import cuda as CUDA

BACKEND = "chorus"
if BACKEND.upper() not in _dist.Backend._plugins:
    if int(torch.__version__.split(".")[0]) >= 2:
        _dist.Backend.register_backend(BACKEND, create_process_group, devices=["cpu", "cuda"] if CUDA else ["cpu"])
    else:
        _dist.Backend.register_backend(BACKEND, create_process_group)

__all__ = ["BACKEND", "CUDA", "create_process_group"]
