"""DDP's work in the traced step: rank 0's buffers broadcast before the forward, and the
gradients all-reduced in DDP's buckets after the backward (spec.data_parallel).

The collectives are peakcut's collective ops (ir.collectives), traced as graph nodes: each
bucket is the concatenation of its gradients, divided by the group's size (as DDP's reducer
divides each gradient while it copies it into its bucket), all-reduced in place and waited
for; the optimizer then reads each gradient as a view of its reduced bucket. Buckets follow
the order the gradients become ready in the traced backward and DDP's capacities (the
first bucket small), as DDP rebuilds its buckets after its first step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.spec.data_parallel import DataParallelSpec


class ReadyOrder:
    """The order the backward produces the gradients of `tensors` (their names), recorded
    by tensor hooks that change nothing."""

    def __init__(self, tensors: Sequence[torch.Tensor], names: Sequence[str]) -> None:
        self.names: list[str] = []
        self._handles = [t.register_hook(self._recorder(n)) for t, n in zip(tensors, names, strict=True)]

    def _recorder(self, name: str):     # noqa: ANN202 - a tensor hook
        def record(grad: torch.Tensor) -> None:
            self.names.append(name)
        return record

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def bucket_names(ready: Sequence[str], params: dict[str, torch.Tensor], spec: DataParallelSpec
                 ) -> list[list[str]]:
    """DDP's buckets of the parameters named in `ready` (in ready order), as
    torch.distributed's own bucket assignment makes them with the spec's capacities."""
    tensors = [torch.empty(params[n].shape, dtype=params[n].dtype, device="meta") for n in ready]
    limits = [spec.first_bucket_bytes, spec.bucket_bytes]
    indices, _ = torch.distributed._compute_bucket_assignment_by_size(tensors, limits)
    buckets = [[ready[i] for i in bucket] for bucket in indices]
    first = {name: i for i, name in enumerate(ready)}
    return sorted(buckets, key=lambda bucket: min(first[n] for n in bucket))


def broadcast_buffers(buffers: Sequence[torch.Tensor], spec: DataParallelSpec) -> None:
    """Rank 0's buffers into every rank's, in place (DDP's forward_sync_buffers)."""
    for buffer in buffers:
        torch.ops.peakcut.broadcast_(buffer, 0, spec.group_name, spec.world_size)
        torch.ops.peakcut.wait_collective(buffer, [])


def all_reduced(grads: dict[str, torch.Tensor], buckets: Sequence[Sequence[str]], spec: DataParallelSpec
                ) -> dict[str, torch.Tensor]:
    """Each gradient averaged over the group, bucket by bucket (DDP's default hook)."""
    out = dict(grads)
    for bucket in buckets:
        names = [n for n in bucket if n in grads]
        if not names:
            continue
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        flat.mul_(1.0 / spec.world_size)
        parts = flat.split([grads[n].numel() for n in names])   # views first: only readers wait
        for n, part in zip(names, parts, strict=True):
            out[n] = part.view(grads[n].shape)
        torch.ops.peakcut.all_reduce_(flat, "sum", spec.group_name, spec.world_size)
        torch.ops.peakcut.wait_collective(flat, [])
    return out
