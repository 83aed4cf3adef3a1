"""Swapping (MAGIS §5.2, Fig. 8e-f): a tensor is copied to host memory right after it is
produced (Store, peakcut.store) and copied back right before the first of some later users
(Load, peakcut.load), which then read the loaded copy; and its dual, de-swapping.

Safety (docs/design.md: same numbers, in-place updates are real, memory counted per storage):
- never a caller-held tensor (parameter, buffer, optimizer state, batch): the optimizer's
  in-place update of a swapped parameter would land on the copy (the MAGIS reference code
  lost 6 of 20 parameter updates on UNet this way);
- never a program output, a tensor that swap ops produced, or one that is not
  non-overlapping and dense (the copies keep strides, so the copy must be a plain memcpy);
- nothing may write the tensor's storage after its producer and before the store reads it:
  the host copy would be stale. A node may write it in place later only when every later
  use of the storage (readers and in-place writers alike) reads the loaded copy or a view
  that follows it there: the original is then never touched again, and the write lands on
  the loaded copy (a running sum that the next part adds to, swapped out between parts);
- views that the users make of the tensor move into the loaded copy's storage;
- users may read an identity view of the tensor (the forward's detach of a tensor saved for
  the backward: peakcut.transform.rewrite.IDENTITY_VIEWS): they read the loaded copy instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.ir.edit import GraphEditor, splice
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.ops import LOAD_OP, STORE_OP, is_swap_op
from peakcut.ir.tags import NodeTags, SwapTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    StorageMove,
    alias_closure,
    ancestors,
    apply_moves,
    check_order_matches,
    describe_node,
    describe_tensor,
    describe_users,
    identity_views,
    program_output_storages,
    reads_any,
    why_not_move,
    writers_of,
)


def is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the elements exactly fill numel consecutive slots, in some dimension order
    (non-overlapping and dense, like torch's internal check): a copy with the same strides is
    then one memcpy of numel * itemsize bytes."""
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda d: d[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True


def _why_not_tensor(g: Graph, tensor: int) -> str | None:
    meta = g.tensors[tensor]
    what = describe_tensor(g, tensor)
    if meta.role.caller_held:
        return (f"{what} is held by the caller ({meta.role.value}): parameters, buffers, optimizer "
                "state and batch tensors are never swapped (an in-place update would land on the "
                "copy and be lost)")
    if g.is_host_storage(meta.storage):
        return f"{what} already lives in host memory"
    prod = g.producer(tensor)
    if prod is None:
        return f"{what} has no producer"
    if g.is_input_copy(g.nodes[prod]):
        return f"{what} is the device copy of a program input kept in host memory ({describe_node(g, prod)})"
    if is_swap_op(g.nodes[prod].op):
        return f"{what} is made by a swap op ({describe_node(g, prod)}): de-swap instead"
    if tensor in g.outputs or meta.storage in program_output_storages(g):
        return f"{what} is (or shares storage with) a program output: it lives to the end anyway"
    if meta.numel == 0:
        return f"{what} is empty: there is nothing to swap"
    if not is_dense(meta.shape, meta.stride):
        return (f"{what} is not non-overlapping and dense (stride {meta.stride}): its copy would "
                "not be a plain memcpy; swap a dense tensor instead")
    return None


def _producer(g: Graph, tensor: int) -> int:
    """The node that makes `tensor` (the rules check it has one before they apply)."""
    node = g.producer(tensor)
    if node is None:
        raise RuleError(f"internal: {describe_tensor(g, tensor)} has no producer")
    return node


def _why_not_stale(g: Graph, tensor: int, users: Sequence[int] | None = None) -> str | None:
    """A node writing the tensor's storage after its producer would make the host copy stale,
    unless every later use of the storage follows `users` to the loaded copy (_all_follow)."""
    meta = g.tensors[tensor]
    prod = g.producer(tensor)
    written = writers_of(g, {meta.storage}).get(meta.storage, [])
    if not written:
        return None
    before = ancestors(g, prod) if prod is not None else set()
    late = [m for m in written if m != prod and m not in before]
    if late and (users is None or not _all_follow(g, tensor, users, before)):
        return (f"{describe_node(g, late[0])} writes the storage of {describe_tensor(g, tensor)} "
                "in place after it is produced: the host copy would be stale (unless every later "
                "use, the writer included, reads the loaded copy)")
    return None


def _all_follow(g: Graph, tensor: int, users: Sequence[int], before: set[int]) -> bool:
    """True when every node after the producer that reads a tensor of `tensor`'s storage reads
    it through the loaded copy: a user reading `tensor` or its identity views (rewired), or
    any node reading a view the users make (moved into the copy's storage). Nodes that only
    make identity views of `tensor` touch no data and are left out, and so are its swaps'
    stores (they read it right after the producer, before any late write)."""
    storage = g.tensors[tensor].storage
    rewired = {tensor, *identity_views(g, tensor)}
    moved = set(alias_closure(g, storage, users))
    mine = set(users)
    skip = before | {g.producer(tensor)}
    same = {t for t, meta in g.tensors.items() if meta.storage == storage}
    for nid in sorted({u for t in same for u in g.users(t)} - skip):
        node = g.nodes[nid]
        on_storage = [t for t in node.input_ids() if t in same]
        if (node.output_ids() and all(v in rewired for v in node.output_ids())) or _stores(node, tensor):
            continue
        if any(t not in moved and not (nid in mine and t in rewired) for t in on_storage):
            return False
    return True


def _stores(node: Node, tensor: int) -> bool:
    """True when `node` is a swap's store of `tensor`."""
    tag = node.tags.get(SwapTag)
    return node.op == STORE_OP and tag is not None and tag.of == tensor and node.input_ids() == [tensor]


def _why_not_users(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> str | None:
    what = describe_tensor(g, tensor)
    if not users:
        return f"no users given to read a loaded copy of {what}"
    # `order` lists every node once (checked by the caller): index() is its position
    prod = g.producer(tensor)
    prod_at = order.index(prod) if prod is not None else None
    read = (tensor, *identity_views(g, tensor))
    for u in users:
        if u not in g.nodes:
            return f"user {u} is not a node of the graph"
        if not reads_any(g.nodes[u], read):
            return f"{describe_node(g, u)} does not read {what}"
        if is_swap_op(g.nodes[u].op):
            return f"{describe_node(g, u)} is a swap op: it keeps reading the original"
        if prod_at is not None and order.index(u) <= prod_at:
            return f"{describe_node(g, u)} runs before the producer of {what} in this order"
    return None


def _why_not_swap(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> str | None:
    if tensor not in g.tensors:
        return f"tensor {tensor} is not in the graph"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    reason = (_why_not_tensor(g, tensor) or _why_not_users(g, order, tensor, users)
              or _why_not_stale(g, tensor, users))
    if reason:
        return reason
    meta = g.tensors[tensor]
    views = [v for v in alias_closure(g, meta.storage, users) if v != tensor]
    return why_not_move(g, views, meta.nbytes, meta.storage_offset * meta.itemsize)


def why_not_swap(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> str | None:
    """Why `users` cannot read a swapped-out-and-in copy of `tensor` (None when swap applies)."""
    return _why_not_swap(g, order, tensor, list(dict.fromkeys(users)))


def _spliced(order: Sequence[int], producer: int, first_user: int, store: int,
             load: int) -> list[int]:
    """`order` with `store` right after `producer` and `load` right before `first_user`."""
    out = splice(order, list(order).index(producer) + 1, [store])
    return splice(out, out.index(first_user), [load])


def swap(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> Rewrite:
    """Store `tensor` to host right after its producer; Load it back right before the first of
    `users`, which read the loaded copy. Where a swap's store of `tensor` already runs before
    those users, the new load reads its host copy instead (one store, several loads).

    Store: peakcut.store(x) -> host tensor, new storage of the tensor's dense span
    (numel * itemsize, offset 0), same shape/stride/dtype. Load: peakcut.load(host,
    device=torch.device(g.device)) -> device tensor in a new storage. Both carry
    the tag SwapTag(tensor). Raises RuleError (why_not_swap's reason) when not applicable.
    """
    users = list(dict.fromkeys(users))
    reason = _why_not_swap(g, order, tensor, users)
    if reason:
        raise RuleError(reason)
    meta = g.tensors[tensor]
    prod = g.nodes[_producer(g, tensor)]
    users = sorted(users, key=order.index)   # order lists every node once (checked above)
    first = g.nodes[users[0]]
    capture_first = min(users, key=g.order.index)

    shared = _store_before(g, order, tensor, first.id, capture_first)
    edit = GraphEditor(g)
    label = meta.name or str(tensor)
    device_storage = edit.add_storage(meta.nbytes)
    loaded = TensorMeta(edit.new_id(), meta.shape, meta.stride, meta.dtype, device_storage, 0,
                        Role.ACTIVATION, f"{label}_loaded")
    tags = NodeTags(SwapTag(tensor))
    if shared is None:
        host = TensorMeta(edit.new_id(), meta.shape, meta.stride, meta.dtype, edit.add_storage(meta.nbytes), 0,
                          Role.ACTIVATION, f"{label}_host")
        store = Node(id=edit.new_id(), op=STORE_OP, args=(TensorRef(tensor),), kwargs={},
                     outputs=(host.id,), module=prod.module, phase=prod.phase,
                     name=f"store_{label}", tags=tags)
        edit.add_node(store, [host])
        host_id = host.id
    else:
        (host_id,) = g.nodes[shared].output_ids()
    load = Node(id=edit.new_id(), op=LOAD_OP, args=(TensorRef(host_id),),
                kwargs={"device": torch.device(g.device)}, outputs=(loaded.id,),
                module=first.module, phase=first.phase, name=f"load_{label}",
                tags=tags)
    views = tuple(v for v in alias_closure(g, meta.storage, users) if v != tensor)
    edit.add_node(load, [loaded])
    rewired = {t: loaded.id for t in (tensor, *identity_views(g, tensor))}
    for u in users:
        edit.rewire(u, rewired)
    # the users' views and in-place writes of the tensor follow it (_all_follow)
    apply_moves(edit, [StorageMove(meta.storage, device_storage,
                                   meta.storage_offset * meta.itemsize, views)])
    out = (f"swap {describe_tensor(g, tensor)} out after {describe_node(g, prod.id)}"
           if shared is None else f"load {describe_tensor(g, tensor)} again from its host copy")
    description = f"{out}, in before {describe_users(g, users)}"
    if shared is not None:
        edit.insert_in_order(edit.graph.order.index(capture_first), [load.id])
        return Rewrite(graph=edit.finish(), order=splice(order, list(order).index(first.id), [load.id]),
                       added=(load.id,), changed=tuple(users), removed=(), description=description)
    at = g.order.index(prod.id) + 1
    edit.insert_in_order(at, [store.id])
    edit.insert_in_order(edit.graph.order.index(capture_first), [load.id])
    return Rewrite(
        graph=edit.finish(), order=_spliced(order, prod.id, first.id, store.id, load.id),
        added=(store.id, load.id), changed=tuple(users), removed=(), description=description,
    )


def _store_before(g: Graph, order: Sequence[int], tensor: int, first: int, capture_first: int) -> int | None:
    """A swap's store of `tensor` that runs before `first` in `order` and `capture_first` in
    the graph's order: another load may read its host copy (nothing writes a host copy, and
    the store ran before any late in-place write, _why_not_stale), so the tensor is written
    to the host once however many times it comes back."""
    for u in g.users(tensor):
        if (_stores(g.nodes[u], tensor) and order.index(u) < order.index(first)
                and g.order.index(u) < g.order.index(capture_first)):
            return u
    return None


# ------------------------------------------------------------------ de-swap
def _why_not_deswap(g: Graph, order: Sequence[int], load_node: int) -> str | None:
    if load_node not in g.nodes:
        return f"node {load_node} is not in the graph"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    load = g.nodes[load_node]
    what = describe_node(g, load_node)
    if load.op != LOAD_OP:
        return f"{what} is not a load (peakcut.load)"
    tensor = tag.of if (tag := load.tags.get(SwapTag)) is not None else None
    if tensor is None:
        return f"{what} carries no swap tag"
    if tensor not in g.tensors:
        return f"the original tensor {tensor} of {what} is no longer in the graph"
    if len(load.input_ids()) != 1 or len(load.output_ids()) != 1:
        return f"{what} does not read one host tensor and make one device tensor"
    (host,) = load.input_ids()
    store = g.producer(host)
    if store is None or g.nodes[store].op != STORE_OP or g.nodes[store].input_ids() != [tensor]:
        return f"{what} does not load a store of {describe_tensor(g, tensor)}"
    reason = _why_not_stale(g, tensor)
    if reason:
        return reason
    meta = g.tensors[tensor]
    (loaded,) = load.output_ids()
    if loaded in g.outputs:
        return f"the loaded {describe_tensor(g, loaded)} is a program output"
    readers = g.users(loaded)
    views = [v for v in alias_closure(g, g.tensors[loaded].storage, readers) if v != loaded]
    return why_not_move(g, views, g.storages[meta.storage], -meta.storage_offset * meta.itemsize)


def _swapped(load: Node) -> int:
    """The tensor a load loads back (its swap tag; checked by _why_not_deswap)."""
    tag = load.tags.get(SwapTag)
    if tag is None:
        raise RuleError(f"internal: node {load.name} carries no swap tag")
    return tag.of


def why_not_deswap(g: Graph, order: Sequence[int], load_node: int) -> str | None:
    """Why the readers of `load_node`'s copy cannot read the original again (None: applies)."""
    return _why_not_deswap(g, order, load_node)


def deswap(g: Graph, order: Sequence[int], load_node: int) -> Rewrite:
    """The dual of swap: readers of the loaded copy read the original tensor again; the load is
    removed, and its store too when no other load reads that host copy."""
    reason = _why_not_deswap(g, order, load_node)
    if reason:
        raise RuleError(reason)
    load = g.nodes[load_node]
    tensor = _swapped(load)
    meta = g.tensors[tensor]
    (host,) = load.input_ids()
    (loaded,) = load.output_ids()
    readers = list(g.users(loaded))
    loaded_storage = g.tensors[loaded].storage
    views = tuple(v for v in alias_closure(g, loaded_storage, readers) if v != loaded)

    edit = GraphEditor(g)
    for u in readers:
        edit.rewire(u, {loaded: tensor})
    apply_moves(edit, [StorageMove(loaded_storage, meta.storage,
                                   -meta.storage_offset * meta.itemsize, views)])
    edit.remove_node(load_node)
    edit.remove_storages([loaded_storage])
    removed = [load_node]
    if not edit.graph.users(host):
        store = _producer(g, host)
        edit.remove_node(store)
        edit.remove_storages([g.tensors[host].storage])
        removed.append(store)
    return Rewrite(
        graph=edit.finish(), order=[x for x in order if x not in removed], added=(),
        changed=tuple(readers), removed=tuple(removed),
        description=f"un-swap {describe_tensor(g, tensor)}: {len(readers)} reader(s) read it again",
    )
