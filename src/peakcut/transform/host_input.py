"""What a program input needs to be kept in host memory between steps, whatever it holds
(optimizer state: offload_state.py; a parameter: offload_param.py): the step reads it, it is a
dense tensor filling its own storage, and no program output or other input shares that
storage (the host copy holds just it, and nothing else reads the device bytes it frees)."""

from __future__ import annotations

from peakcut.ir.graph import Graph
from peakcut.transform.rewrite import describe_tensor
from peakcut.transform.swap import is_dense


def why_not_host_input(g: Graph, t: int) -> str | None:
    """Why program input `t` of g cannot be kept in host memory (module doc); None when it can.
    The caller has checked that `t` is a program input of the kind it keeps there."""
    meta = g.tensors[t]
    what = describe_tensor(g, t)
    if g.is_host_storage(meta.storage):
        return f"{what} is kept in host memory already"
    if not g.users(t):
        return f"{what} is not read by the step"
    if not is_dense(meta.shape, meta.stride) or meta.storage_offset or g.storages[meta.storage] != meta.nbytes:
        return f"{what} is not a dense tensor filling its storage (the host copy holds just it)"
    if meta.storage in g.output_storages():
        return f"{what} shares its storage with a program output"
    others = [i for i in g.inputs if i != t and g.tensors[i].storage == meta.storage]
    if others:
        return f"{what} shares its storage with another program input ({describe_tensor(g, others[0])})"
    return None
