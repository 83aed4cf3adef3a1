"""An FSDP2 step (torch.distributed.fsdp.fully_shard): what its hooks do, as a step runs it.

fully_shard makes each parameter of a unit a DTensor sharded along its first dimension over a
1-D device mesh; its hooks all-gather a unit's parameters before the unit runs (forward and
backward), and reduce-scatter the gradients, averaged over the ranks, into each rank's
shard, which the optimizer then updates. A captured step does the same with graph nodes
(capture.fully_sharded): each parameter's shard is an input, all-gathered where the step
uses it, and its gradient is reduce-scattered back. `describe_fully_sharded` reads what it
needs from the user's module and refuses what it does not do (mixed precision and offload
policies, a 2-D mesh, shards of unequal sizes, parameters fully_shard does not shard).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class FullyShardedSpec:
    """The process group of an FSDP2 step and the full shape of each sharded parameter.

    group_name, world_size, rank: the mesh's process group, its size and this rank;
    full_shapes: parameter name -> its unsharded shape; mesh: the DeviceMesh (not part of
    the step's identity: the group's name is).
    """

    group_name: str
    world_size: int
    rank: int
    full_shapes: dict[str, tuple[int, ...]]
    mesh: Any = field(compare=False, repr=False)

    def as_dict(self) -> dict[str, object]:
        """The spec as the report writes it."""
        return {"kind": "fsdp2", "group": self.group_name, "world_size": self.world_size,
                "sharded_parameters": len(self.full_shapes)}


def is_fully_sharded(model: object) -> bool:
    """Whether fully_shard was applied to `model` (its root)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (sharing its storage); any other tensor itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def describe_fully_sharded(model: torch.nn.Module) -> FullyShardedSpec:
    """The spec of `model`'s FSDP2 step; ValueError naming what is not supported."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(model, FSDPModule):
        raise TypeError(f"expected a module fully_shard was applied to, got {type(model).__name__}")
    for path, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        where = f"module '{path}'" if path else "the model"
        if state._mp_policy != MixedPrecisionPolicy():
            raise ValueError(f"FSDP2: {where} has a MixedPrecisionPolicy ({state._mp_policy}): not supported by "
                             "peakcut; use torch.autocast in loss_fn")
        param_group = state._fsdp_param_group
        if param_group is not None and isinstance(param_group.offload_policy, CPUOffloadPolicy):
            raise ValueError(f"FSDP2: {where} has a CPUOffloadPolicy: not supported by peakcut (its plans offload "
                             "optimizer state and parameters per tensor instead)")
    mesh = None
    full_shapes: dict[str, tuple[int, ...]] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        if not isinstance(p, DTensor):
            raise ValueError(f"FSDP2: parameter '{name}' is not sharded (fully_shard the module that holds it)")
        if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
            raise ValueError(f"FSDP2: parameter '{name}' is placed {p.placements} on a {p.device_mesh.ndim}-D mesh; "
                             "peakcut plans FSDP2 sharded along dimension 0 of a 1-D mesh (no HSDP)")
        if mesh is None:
            mesh = p.device_mesh
        elif p.device_mesh != mesh:
            raise ValueError(f"FSDP2: parameter '{name}' is on another device mesh than the first parameter")
        if p.shape[0] % mesh.size() != 0:
            raise ValueError(f"FSDP2: parameter '{name}' has {p.shape[0]} rows, not a multiple of the "
                             f"{mesh.size()} ranks: shards of unequal sizes are not supported by peakcut yet")
        full_shapes[name] = tuple(p.shape)
    if mesh is None:
        raise ValueError("FSDP2: the model has no parameters")
    process_group = mesh.get_group()
    return FullyShardedSpec(group_name=str(process_group.group_name), world_size=int(mesh.size()),
                            rank=int(mesh.get_local_rank()), full_shapes=full_shapes, mesh=mesh)
