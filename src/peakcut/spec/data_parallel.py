"""A DistributedDataParallel step: what DDP does around the user's module, as a step runs it.

DDP (torch.nn.parallel.DistributedDataParallel) keeps a replica of the module on every rank
of a process group. Before each forward it broadcasts rank 0's buffers (its
`forward_sync_buffers`, on by default); in the backward its reducer copies each gradient,
divided by the group's size, into a flat bucket of about `bucket_cap_mb` and all-reduces
(sums) the bucket once all of its gradients are ready; the optimizer then updates every
replica with the same averaged gradients. A captured step does the same with graph nodes
(capture.data_parallel): `describe_data_parallel` reads what it needs from the user's DDP
module, and refuses what it does not do (a communication hook, DDP's mixed precision,
unused parameters, ignored parameters, SyncBatchNorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the first bucket DDP fills is kept small, so the first all-reduce starts early
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


@dataclass(frozen=True)
class DataParallelSpec:
    """The process group a data-parallel step runs on and how DDP buckets its gradients.

    group_name: the process group's name (torch.distributed's ProcessGroup.group_name);
    world_size, rank: its size and this process's rank in it; bucket_bytes: DDP's bucket
    capacity, first_bucket_bytes: the first bucket's; sync_buffers: whether rank 0's buffers
    are broadcast before each forward.
    """

    group_name: str
    world_size: int
    rank: int
    bucket_bytes: int
    first_bucket_bytes: int
    sync_buffers: bool

    def as_dict(self) -> dict[str, object]:
        """The spec as the report and the step's signature write it."""
        return {"kind": "ddp", "group": self.group_name, "world_size": self.world_size,
                "bucket_bytes": self.bucket_bytes, "first_bucket_bytes": self.first_bucket_bytes,
                "sync_buffers": self.sync_buffers}


def is_data_parallel(model: object) -> bool:
    """Whether `model` is a DistributedDataParallel module."""
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def describe_data_parallel(ddp: torch.nn.Module) -> tuple[torch.nn.Module, DataParallelSpec]:
    """The module DDP wraps and the spec of its step; ValueError naming what is not supported."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(f"expected a DistributedDataParallel module, got {type(ddp).__name__}")
    logging_data = ddp._get_ddp_logging_data()
    refusals = [
        (bool(logging_data.get("comm_hook")),
         f"a communication hook ({logging_data.get('comm_hook')}) is registered; peakcut all-reduces "
         "the gradients as DDP's default hook does (divided by the group's size, summed)"),
        (ddp.mixed_precision is not None, "DDP's mixed_precision is set; use torch.autocast in loss_fn"),
        (bool(ddp.parameters_to_ignore),
         f"parameters are ignored by DDP ({sorted(ddp.parameters_to_ignore)[:3]})"),
        (ddp.find_unused_parameters,
         "find_unused_parameters=True; peakcut needs every trainable parameter to get a gradient"),
        (bool(logging_data.get("has_sync_bn")),
         "the module has SyncBatchNorm layers, whose forward gathers statistics across ranks"),
        (not ddp.require_backward_grad_sync, "the step is inside ddp.no_sync()"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"DistributedDataParallel: {why}: not supported by peakcut")
    group = ddp.process_group
    config = getattr(ddp, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", DEFAULT_FIRST_BUCKET_BYTES)
    spec = DataParallelSpec(
        group_name=str(group.group_name), world_size=int(group.size()), rank=int(group.rank()),
        bucket_bytes=int(ddp.bucket_bytes_cap), first_bucket_bytes=int(min(first, ddp.bucket_bytes_cap)),
        sync_buffers=bool(ddp.forward_sync_buffers and ddp.require_forward_param_sync))
    return ddp.module, spec
