"""Models trained by more than one process, checked before capture.

DistributedDataParallel all-reduces gradients from hooks of its C++ reducer, and FSDP2
gathers parameters and reduce-scatters gradients from hooks of its own; a traced step runs
neither: capture takes the module DDP wraps and traces DDP's collectives itself
(`data_parallel`, capture.data_parallel), or an FSDP2 module with its hooks off and FSDP2's
collectives traced (`fully_sharded`, capture.fully_sharded); peakcut.optimize hands either
over that way. Otherwise a DDP module, an FSDP2 module, FSDP1 and DTensor parameters are
refused by name. A model that is not
wrapped, in a process whose default process group has more than one rank, would be updated
on each rank with that rank's own gradients, never all-reduced: refused too.
"""

from __future__ import annotations

import torch

from peakcut.capture.errors import CaptureError

_ONE_PROCESS = ("peakcut plans one process's step, a DistributedDataParallel step or an FSDP2 (fully_shard) "
                "step; FSDP1 is not supported")


def _where(path: str) -> str:
    return "the model" if not path else f"module '{path}'"


def check_distributed(model: torch.nn.Module, data_parallel: bool = False, fully_sharded: bool = False) -> None:
    """Raise CaptureError for a DDP- or FSDP-wrapped model, DTensor parameters, or a default
    process group of more than one rank (unless `data_parallel`: the module a DDP wraps,
    captured with DDP's collectives; or `fully_sharded`: an FSDP2 module captured with its
    collectives)."""
    if not torch.distributed.is_available():
        return
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    for path, module in model.named_modules():
        if isinstance(module, DistributedDataParallel):
            raise CaptureError(
                f"{_where(path)} is wrapped in DistributedDataParallel (DDP): DDP all-reduces the "
                "gradients from hooks of its reducer, which a captured step never runs. "
                "peakcut.optimize takes the DDP module itself and plans its step with DDP's all-reduce; "
                "capture() takes the module a DDP wraps (ddp.module) with data_parallel=")
        if isinstance(module, FSDPModule) and not fully_sharded:
            raise CaptureError(
                f"{_where(path)} ({type(module).__name__}) is sharded with FSDP2 (fully_shard): its "
                "parameters are DTensors gathered and its gradients reduce-scattered from FSDP's hooks, "
                "which a captured step never runs. peakcut.optimize takes the FSDP2 model itself (fully_shard "
                "applied to its root) and plans its step with FSDP2's collectives")
        if isinstance(module, FullyShardedDataParallel):
            raise CaptureError(
                f"{_where(path)} is wrapped in FullyShardedDataParallel (FSDP): its parameters are "
                "gathered and its gradients reduce-scattered from FSDP's hooks, which a captured step "
                f"never runs; {_ONE_PROCESS}")
    for name, p in model.named_parameters(remove_duplicate=True):
        if isinstance(p, DTensor) and not fully_sharded:
            raise CaptureError(
                f"parameter '{name}' is a DTensor (placements {p.placements} on a device mesh of "
                f"{p.device_mesh.size()} ranks): {_ONE_PROCESS}")
    dist = torch.distributed
    if not (data_parallel or fully_sharded) and dist.is_initialized() and dist.get_world_size() > 1:
        raise CaptureError(
            f"torch.distributed is initialized: the default process group (backend "
            f"'{dist.get_backend()}') has world size {dist.get_world_size()} (this is rank "
            f"{dist.get_rank()}), and the model is not wrapped in DistributedDataParallel or FSDP: a "
            "captured step would update each rank's parameters with that rank's own gradients, never "
            "all-reduced. Wrap the model in DistributedDataParallel or apply fully_shard (FSDP2) and pass "
            "that to peakcut.optimize, or capture in a process without a multi-rank process group")
