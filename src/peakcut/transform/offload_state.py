"""Optimizer-state offload: a state tensor (an Adam moment, a momentum buffer) lives in host
memory between steps and comes to the device only for its own update.

On a program whose state input x (storage S) is read by its update nodes:

    before                                  after
    lerp_(x, g, ..)  -> x1 (in S)           x_dev = peakcut.load(x)                (new storage S')
    mul_(x1, ..)     -> x2 (in S)           lerp_(x_dev, g, ..) -> x1 (now in S')
    ...                                     mul_(x1, ..)        -> x2 (in S')
                                            ...
                                            peakcut.writeback(x, x2)   after every write of S'

x is then a host-resident input (Graph.host_inputs): device memory holds S' only from the load
to its last use instead of the whole step, and the step binding keeps the optimizer's state
tensor in (pinned) host memory. The update's numbers do not change: it runs on the same values
in another buffer, and the writeback puts the result where the optimizer keeps it.

Sites (state_windows): the optimizer-state inputs still on the device whose update window
(load to last write) lies away from a step of the order (the memory peak), with the distance.
The rule (peakcut.rules.offload_state_rule) places the load as late as its copy can be hidden
and the writeback right after the last write; the code is codegen's (codegen/input_copy_code.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.host_input import why_not_host_input
from peakcut.transform.rewrite import (
    Rewrite,
    StorageMove,
    alias_closure,
    apply_moves,
    check_order_matches,
    describe_tensor,
    positions,
    spliced,
)


def offload_state_nodes(g: Graph) -> dict[int, Node]:
    """The loads and writebacks of optimizer state kept in host memory in g."""
    return g.input_copies(Role.OPT_STATE)


def _aliases(g: Graph, tensor: int) -> list[int]:
    """The tensors the step makes in `tensor`'s storage (in-place results and views of it)."""
    return alias_closure(g, g.tensors[tensor].storage, g.users(tensor))


def _window(g: Graph, pos: Mapping[int, int], tensor: int) -> tuple[list[int], list[int], int]:
    """(readers of `tensor`, nodes writing its storage in place, each by position `pos`; the
    last position at which the storage is touched: by them or by a reader of an alias)."""
    readers = sorted(g.users(tensor), key=pos.__getitem__)
    writers = sorted(g.storage_writers(g.tensors[tensor].storage), key=pos.__getitem__)
    alias_readers = (u for a in _aliases(g, tensor) for u in g.users(a))
    end = max((pos[n] for n in (*readers, *writers, *alias_readers)), default=-1)
    return readers, writers, end


def state_windows(g: Graph, order: Sequence[int], step: int) -> list[tuple[int, tuple[int, ...], int]]:
    """(state input, its readers in order, steps between `step` and its update's window) for
    every optimizer-state input on the device whose window does not hold `step` (why_not has
    the full list of refusals)."""
    pos = positions(order)
    found = []
    for t in g.inputs:
        meta = g.tensors[t]
        if meta.role is not Role.OPT_STATE or g.is_host_storage(meta.storage) or not g.users(t):
            continue
        readers, _, end = _window(g, pos, t)
        start = pos[readers[0]]
        gap = start - step if step < start else step - end
        if gap > 0:
            found.append((t, tuple(readers), gap))
    return found


def why_not_offload_state(g: Graph, order: Sequence[int], t: int) -> str | None:
    """Why state input `t` cannot be kept in host memory in (g, order); None when it can."""
    if t not in g.tensors or t not in g.inputs:
        return f"tensor {t} is not a program input"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    meta = g.tensors[t]
    what = describe_tensor(g, t)
    if meta.role is not Role.OPT_STATE or not g.input_names[g.inputs.index(t)].startswith("state:"):
        return f"{what} is not optimizer state ({meta.role.value})"   # e.g. a GradScaler's scale
    shared = why_not_host_input(g, t)
    if shared is not None:
        return shared
    phases = {g.nodes[n].phase for n in (*g.users(t), *g.storage_writers(meta.storage))}
    if phases - {Phase.OPTIMIZER}:
        return f"{what} is read or written outside the optimizer update"
    return None


def offload_state(g: Graph, order: Sequence[int], tensors: Sequence[int], description: str) -> Rewrite:
    """State inputs `tensors` (each checked by why_not_offload_state on g) kept in host memory,
    in one edit."""
    pos = positions(order)
    edit = GraphEditor(g)
    before: dict[int, list[int]] = {}       # load -> its readers (it goes right before the first)
    after: dict[int, list[int]] = {}        # writeback -> the writes it follows
    added: list[int] = []
    changed: list[int] = []
    for t in tensors:
        meta = g.tensors[t]
        readers, writers, _ = _window(g, pos, t)
        label = meta.name or str(t)
        storage = edit.add_storage(meta.nbytes)
        device_copy = TensorMeta(edit.new_id(), meta.shape, meta.stride, meta.dtype, storage, 0,
                                 Role.ACTIVATION, f"{label}_device")
        load = Node(id=edit.new_id(), op=LOAD_OP, args=(TensorRef(t),),
                    kwargs={"device": torch.device(g.device)}, outputs=(device_copy.id,),
                    phase=Phase.OPTIMIZER, name=f"load_{label}")
        edit.add_node(load, [device_copy])
        apply_moves(edit, [StorageMove(meta.storage, storage, 0, tuple(_aliases(g, t)))])
        for nid in readers:
            edit.rewire(nid, {t: device_copy.id})
        before[load.id] = readers
        added.append(load.id)
        changed.extend(readers)
        if writers:
            # the whole copy goes back once every write is done (control edges order it)
            back = Node(id=edit.new_id(), op=WRITEBACK_OP, args=(TensorRef(t), TensorRef(device_copy.id)),
                        kwargs={}, outputs=(None,), phase=Phase.OPTIMIZER, name=f"writeback_{label}")
            edit.add_node(back)
            edit.set_control(back.id, writers)
            after[back.id] = writers
            added.append(back.id)
    edit.set_order(spliced(edit.graph.order, (), after, before))
    return Rewrite(graph=edit.finish(), order=spliced(order, (), after, before), added=tuple(added),
                   changed=tuple(changed), removed=(), description=description)
