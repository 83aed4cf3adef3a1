"""FSDP2's work in the traced step (spec.fully_sharded): each parameter all-gathered from the
ranks' shards where the step uses it, and its gradient reduce-scattered and averaged back
into this rank's shard.

The step's inputs are the shards. The module runs on full parameters made by DTensor's own
redistribution (Shard(0) to Replicate, whose gradient is a reduce-scatter of the partial
sums), so the trace holds torch.distributed's functional collectives; fully_shard's hooks,
which would gather and reduce with collectives of their own, are taken off the modules while
the step is traced. After the backward each shard's gradient is divided by the group's size
(FSDP2 averages); clipping takes the norm over every rank's shards (an all-reduce of the
squared local norm, as clip_grad_norm_ on DTensors computes it).

`waits_in_place` rewrites the trace's `wait_tensor(x)` (whose result is x itself) into
peakcut's wait on x, so the collective's result is one tensor in the graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from peakcut.spec.fully_sharded import FullyShardedSpec

_FSDP_STATE = "FSDPState"
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")


def _is_fsdp_hook(fn: object) -> bool:
    owner = getattr(fn, "__self__", None)
    return type(owner).__name__ == _FSDP_STATE


@contextmanager
def fsdp_hooks_removed(model: torch.nn.Module) -> Iterator[None]:
    """fully_shard's forward hooks taken off every module of `model`, put back on exit."""
    saved: list[tuple[dict, dict]] = []
    for module in model.modules():
        for attr in _HOOK_DICTS:
            hooks = getattr(module, attr)
            ours = {k: fn for k, fn in hooks.items() if _is_fsdp_hook(fn)}
            if ours:
                saved.append((hooks, dict(hooks)))
                for k in ours:
                    del hooks[k]
    try:
        yield
    finally:
        for hooks, before in saved:
            hooks.clear()
            hooks.update(before)


def gathered(shard: torch.Tensor, name: str, spec: FullyShardedSpec) -> torch.Tensor:
    """The full parameter `name` from this rank's `shard`: an all-gather over the mesh, whose
    gradient is the reduce-scatter (sum) of the ranks' full gradients."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    shape = torch.Size(spec.full_shapes[name])
    stride = torch.empty(shape, device="meta").stride()
    sharded = DTensor.from_local(shard, spec.mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)
    return sharded.redistribute(spec.mesh, [Replicate()]).to_local(grad_placements=[Partial()])


def averaged(grads: Sequence[torch.Tensor | None], spec: FullyShardedSpec) -> list[torch.Tensor | None]:
    """The shards' summed gradients divided by the group's size (FSDP2's average)."""
    return [None if g is None else g.mul_(1.0 / spec.world_size) for g in grads]


def global_norm(local_total: torch.Tensor, spec: FullyShardedSpec) -> torch.Tensor:
    """The 2-norm over every rank's shards from this rank's: sum of squares all-reduced."""
    squared = local_total ** 2.0
    torch.ops.peakcut.all_reduce_(squared, "sum", spec.group_name, spec.world_size)
    torch.ops.peakcut.wait_collective(squared, [])
    return squared ** 0.5


STORAGE_ALIASES = "peakcut_storage_aliases"
"""gm.meta key: (storage, the storage it stands for) pairs of fake storages, for convert."""


def waits_in_place(gm: torch.fx.GraphModule) -> None:
    """Each `_c10d_functional.wait_tensor(x)` becomes `peakcut.wait_collective(x, [input])`
    (input: what the collective that made x reads, alive until it completes); its readers
    read x (the functional wait returns its argument). The fake values traced after the wait
    live in the wait's fake storage: gm.meta[STORAGE_ALIASES] says it stands for x's."""
    wait = torch.ops._c10d_functional.wait_tensor.default
    aliases = gm.meta.setdefault(STORAGE_ALIASES, [])
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is wait:
            waited = node.args[0]
            out_val, in_val = node.meta.get("val"), waited.meta.get("val")
            if isinstance(out_val, torch.Tensor) and isinstance(in_val, torch.Tensor):
                aliases.append((out_val.untyped_storage(), in_val.untyped_storage()))
            start = waited if isinstance(waited, torch.fx.Node) else None
            reads = [a for a in (start.args if start is not None and start.op == "call_function" else ())
                     if isinstance(a, torch.fx.Node)]
            with gm.graph.inserting_before(node):      # the collective's input lives until its wait
                marker = gm.graph.call_function(torch.ops.peakcut.wait_collective.default, (waited, reads))
                marker.meta.update({k: v for k, v in node.meta.items() if k != "val"})
                marker.meta["val"] = None
            node.replace_all_uses_with(waited)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
