"""Re-materialization (MAGIS §5.2, Fig. 8a-d): later users read a recomputed copy A' of an op A
instead of A's outputs, so A's outputs can be freed early; and its dual, de-re-materialization.

Safety (docs/design.md: in-place updates are real, randomness is not duplicated; and the MAGIS
reference code's bugs):
- only ops the registry knows, that are not views, swap ops, random ops (a recompute would
  draw new numbers) or uninitialized allocations, and that write nothing in place;
- every output of A lives in a storage A allocates, nobody writes later, and that is not a
  program output;
- A' reads A's inputs later than A did. Every node M that writes one of those inputs' storages
  in place and does not run before A (an optimizer update of a parameter A reads, say) gets a
  control edge "M after A'", and A' is placed before M; A' inherits A's own control edges (the
  writes it must see). Without this a recompute could read an already-updated parameter.

A tensor saved for the backward is often read there through the forward's detach of it (the
autograd capture detaches what an op saves): remat of such an identity view (detach, alias:
the same storage, shape, strides and offset) recomputes the node that made the viewed tensor,
and the users read the recompute in place of the view.

A training-mode batch norm is recomputed by its own kernel, without its running statistics
(recompute_call): the same statistics and the same result, bit for bit. Its result
recomputed as the normalize from the saved mean and invstd (one addcmul over x) is not used:
that kernel rounds differently from the batch norm's in some shapes (on a 2-core CPU,
[6,128,64,64]: 14,137 elements differ), so a ReLU's backward could read a mask that differs
from the forward's where the result is within rounding of 0; on the medium U-Net the AdamW
moments of batch-norm biases would differ from eager's by 8.4e-4 (tolerance 4.9e-4), and by
7.7e-2 in a plan with many such recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from peakcut.ir.edit import GraphEditor, splice
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.registry import OpKind, draws_random, lookup
from peakcut.ir.tags import NodeTags, RematTag
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
    identity_source,
    identity_views,
    positions,
    program_output_storages,
    reads_any,
    why_not_move,
    writers_of,
)

# Ops whose output is uninitialized memory: a second call would not return the same values.
UNINITIALIZED_OPS = frozenset({
    "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
    "aten.new_empty.default", "aten.new_empty_strided.default",
})


# Ops whose undeclared in-place writes are state updates a recompute leaves out: given no
# running statistics, training-mode batch norm returns the same outputs and writes nothing
# (the forward updated the statistics once; a second update would be wrong).
_STATE_ARGUMENTS = {"aten.native_batch_norm.default": (3, 4)}   # running_mean, running_var
_TRAINING_ARGUMENT = {"aten.native_batch_norm.default": 5}


def recompute_call(n: Node) -> Node:
    """The call a recompute of `n` makes: `n` itself, or a training-mode batch norm with its
    running statistics left out (module constant _STATE_ARGUMENTS)."""
    state = _STATE_ARGUMENTS.get(n.op)
    if state is None or len(n.args) <= _TRAINING_ARGUMENT[n.op] or n.args[_TRAINING_ARGUMENT[n.op]] is not True:
        return n
    return replace(n, args=tuple(None if i in state else a for i, a in enumerate(n.args)))


def through_identities(g: Graph, node: int) -> tuple[int, dict[int, int]]:
    """The node to recompute for a site at `node`: `node`, or, when `node` makes an identity view
    (peakcut.transform.rewrite.IDENTITY_VIEWS), the node that made the viewed tensor; with every
    identity view of that node's outputs mapped to the output it stands for (its readers may
    read the recompute instead)."""
    outs = g.nodes[node].output_ids()
    if len(outs) == 1:
        source = identity_source(g, outs[0])
        producer = g.producer(source)
        if source != outs[0] and producer is not None:
            node = producer
    return node, {v: t for t in g.nodes[node].output_ids() for v in identity_views(g, t)}


@dataclass(frozen=True)
class _Plan:
    node: int                      # the node recomputed (`node`, or the one its identity views view)
    aliases: dict[int, int]        # identity view -> output of `node` it stands for (users rewired)
    users: tuple[int, ...]         # the users, in order
    hazards: tuple[int, ...]       # later in-place writers of A's inputs: must run after A'
    position: int                  # index in `order` to insert A' at
    capture_position: int          # index in g.order to insert A' at


def why_not_recompute_op(g: Graph, node: int, *, views: bool = False) -> str | None:
    """Why running `node` a second time would not give its outputs again, or is no use (a view,
    unless `views`: a copy of a block's forward copies its views too); None when it may."""
    n = g.nodes[node]
    what = describe_node(g, node)
    info = lookup(n.op)
    if info is None:
        return f"{what} is opaque to peakcut (not in the op registry): it is never transformed"
    if info.kind is OpKind.SWAP:
        return f"{what} is a swap op (store/load): de-swap it instead of recomputing it"
    if info.kind is OpKind.VIEW and not views:
        return (f"{what} is a view: its output aliases its input and frees nothing; recompute "
                "the op that allocates the storage")
    if draws_random(n.op, n.args, n.kwargs):
        return (f"{what} draws random numbers: a recompute would not give the same result "
                "(docs/design.md: randomness)")
    if n.op in UNINITIALIZED_OPS:
        return f"{what} returns uninitialized memory: a recompute would not give the same values"
    written = recompute_call(n).mutated_ids()
    if written:
        return (f"{what} writes {describe_tensor(g, written[0])} in place: a recompute would write "
                "it again")
    return None


def _why_not_outputs(g: Graph, node: int) -> str | None:
    n = g.nodes[node]
    what = describe_node(g, node)
    outs = n.output_ids()
    if not outs:
        return f"{what} has no tensor outputs"
    input_storages = {g.tensors[t].storage for t in n.input_ids()}
    held = g.caller_held_storages()
    results = program_output_storages(g)
    for t in outs:
        s = g.tensors[t].storage
        if s in held or s in input_storages or g.storage_owner_of(s) != node:
            return (f"output {describe_tensor(g, t)} of {what} lives in memory the node does not "
                    "allocate (an alias of an input)")
        if s in results:
            return (f"output {describe_tensor(g, t)} of {what} is (or shares storage with) a "
                    "program output: it lives to the end of the step anyway")
    written = writers_of(g, {g.tensors[t].storage for t in outs})
    for s, ms in written.items():
        t = next(t for t in outs if g.tensors[t].storage == s)
        return (f"output {describe_tensor(g, t)} of {what} is written in place later by "
                f"{describe_node(g, ms[0])}: a recompute would miss that write")
    return None


def _why_not_users(g: Graph, order: Sequence[int], node: int, users: Sequence[int],
                   aliases: dict[int, int]) -> str | None:
    what = describe_node(g, node)
    if not users:
        return f"no users given to read a recompute of {what}"
    outs = [*g.nodes[node].output_ids(), *aliases]
    for u in users:
        if u not in g.nodes:
            return f"user {u} is not a node of the graph"
        if u == node:
            return f"{what} cannot read its own recompute"
        if not reads_any(g.nodes[u], outs):
            return f"{describe_node(g, u)} does not read an output of {what}"
    pos = positions(order)
    late = [u for u in users if pos[u] < pos[node]]
    if late:
        return f"{describe_node(g, late[0])} runs before {what} in this order"
    return None


def _insert_index(g: Graph, order: Sequence[int], node: int, users: Sequence[int],
                  hazards: Sequence[int]) -> int | str:
    """Where A' goes in `order`: just before its first user, or before the first later writer
    of its inputs if that comes sooner; a reason string if that is before A's dependencies."""
    pos = positions(order)
    first = min(users, key=pos.__getitem__)
    blocker = min([first, *hazards], key=pos.__getitem__)
    preds = g.predecessors(node)
    last_pred = max(preds, key=pos.__getitem__, default=None)
    if last_pred is not None and pos[last_pred] >= pos[blocker]:
        return (f"a recompute of {describe_node(g, node)} would have to run after "
                f"{describe_node(g, last_pred)} but before {describe_node(g, blocker)}, which "
                "comes first in this order")
    return pos[blocker]


def _plan(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> _Plan | str:
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    node, aliases = through_identities(g, node)
    reason = why_not_recompute_op(g, node) or _why_not_outputs(g, node)
    if reason:
        return reason
    users = tuple(dict.fromkeys(users))
    reason = _why_not_users(g, order, node, users, aliases)
    if reason:
        return reason
    for t in g.nodes[node].output_ids():
        s = g.tensors[t].storage
        views = [v for v in alias_closure(g, s, users) if v != t]
        reason = why_not_move(g, views, g.storages[s], 0)
        if reason:
            return reason
    n = recompute_call(g.nodes[node])
    written = writers_of(g, {g.tensors[t].storage for t in n.input_ids()})
    before = ancestors(g, node) if written else set()   # the walk is long; often not needed
    hazards = tuple(sorted({m for ms in written.values() for m in ms
                            if m not in before and m != node}))
    position = _insert_index(g, order, node, users, hazards)
    if isinstance(position, str):
        return position
    capture_position = _insert_index(g, g.order, node, users, hazards)
    if isinstance(capture_position, str):
        return capture_position + " (capture order)"
    pos = positions(order)
    return _Plan(node, aliases, tuple(sorted(users, key=pos.__getitem__)), hazards, position, capture_position)


def why_not_recompute_node(g: Graph, node: int) -> str | None:
    """Why `node` itself cannot be recomputed, whoever reads it (its op and its outputs); None
    when it may. remat's checks of the users and the order come on top (why_not_remat)."""
    node, _ = through_identities(g, node)
    return why_not_recompute_op(g, node) or _why_not_outputs(g, node)


def why_not_remat(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> str | None:
    """Why `users` cannot read a recompute of `node` (None when remat applies)."""
    plan = _plan(g, order, node, users)
    return plan if isinstance(plan, str) else None


def remat(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> Rewrite:
    """`users` read a recomputed copy A' of `node` (A), placed just before the first of them.

    A' is a new node with A's op and arguments, fresh outputs in fresh storages of the same
    sizes, name '<A>_remat' and the tag RematTag(A). Views that the users make of A's
    outputs move with them into A''s storages. When `node` is an identity view (detach) of
    what A made, A is recomputed and the users read A' in place of the view (module doc).
    Raises RuleError (why_not_remat's reason) when the rule does not apply.
    """
    plan = _plan(g, order, node, users)
    if isinstance(plan, str):
        raise RuleError(plan)
    node = plan.node
    a = recompute_call(g.nodes[node])
    edit = GraphEditor(g)
    storage_map: dict[int, int] = {}
    out_map: dict[int, int] = {}
    metas: list[TensorMeta] = []
    outputs: list[int | None] = []
    for t in a.outputs:
        if t is None:
            outputs.append(None)
            continue
        meta = g.tensors[t]
        if meta.storage not in storage_map:
            storage_map[meta.storage] = edit.add_storage(g.storages[meta.storage])
        t2 = edit.new_id()
        metas.append(TensorMeta(t2, meta.shape, meta.stride, meta.dtype, storage_map[meta.storage],
                                meta.storage_offset, Role.ACTIVATION, f"{meta.name or t}_remat"))
        out_map[t] = t2
        outputs.append(t2)
    first_user = g.nodes[plan.users[0]]
    a2 = Node(id=edit.new_id(), op=a.op, args=a.args, kwargs=dict(a.kwargs), outputs=tuple(outputs),
              multi_output=a.multi_output, module=a.module, phase=first_user.phase,
              name=f"{a.name or a.id}_remat", tags=NodeTags(RematTag(a.id)))
    moves = [StorageMove(s, s2, 0, tuple(v for v in alias_closure(g, s, plan.users)
                                         if v not in out_map))
             for s, s2 in storage_map.items()]
    edit.add_node(a2, metas)
    rewired = {**out_map, **{v: out_map[t] for v, t in plan.aliases.items()}}
    for u in plan.users:
        edit.rewire(u, rewired)
    apply_moves(edit, moves)   # see _plan: nothing that is written in place moves
    if node in g.control:
        edit.set_control(a2.id, g.control[node])
    for m in plan.hazards:
        edit.set_control(m, tuple(sorted({*g.control.get(m, ()), a2.id})))
    edit.insert_in_order(plan.capture_position, [a2.id])
    guard = (f"; runs before in-place writer(s) {', '.join(g.nodes[m].name for m in plan.hazards)}"
             if plan.hazards else "")
    return Rewrite(
        graph=edit.finish(), order=splice(order, plan.position, [a2.id]), added=(a2.id,),
        changed=tuple(dict.fromkeys((*plan.users, *plan.hazards))), removed=(),
        description=f"recompute {describe_node(g, node)} for {describe_users(g, plan.users)}{guard}",
    )


# ------------------------------------------------------------------ de-remat
def _why_not_deremat(g: Graph, order: Sequence[int], remat_node: int) -> str | None:
    if remat_node not in g.nodes:
        return f"node {remat_node} is not in the graph"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    n2 = g.nodes[remat_node]
    what = describe_node(g, remat_node)
    orig = tag.of if (tag := n2.tags.get(RematTag)) is not None else None
    if orig is None:
        return f"{what} is not a recompute (no remat tag)"
    if orig not in g.nodes:
        return f"the original node {orig} of {what} is no longer in the graph"
    a = g.nodes[orig]
    call = recompute_call(a)        # what remat made: a batch norm's call without its running statistics
    if not (call.op == n2.op and call.args == n2.args and call.kwargs == n2.kwargs
            and [t is None for t in a.outputs] == [t is None for t in n2.outputs]):
        return f"{what} no longer computes the same as its original {describe_node(g, orig)}"
    pos = positions(order)
    readers = _readers(g, n2)
    early = [u for u in readers if pos[u] < pos[orig]]
    if early:
        return (f"{describe_node(g, early[0])} runs before the original {describe_node(g, orig)} "
                "in this order: it cannot read the original's outputs")
    written = writers_of(g, {g.tensors[t].storage for t in a.output_ids()})
    if written:
        m = next(iter(written.values()))[0]
        return f"{describe_node(g, m)} writes an output of {describe_node(g, orig)} in place"
    if any(t in g.outputs for t in n2.output_ids()):
        return f"an output of {what} is a program output"
    return None


def _original(remat_node: Node) -> int:
    """The node a recompute recomputes (its remat tag; checked by _why_not_deremat)."""
    tag = remat_node.tags.get(RematTag)
    if tag is None:
        raise RuleError(f"internal: node {remat_node.name} is not a recompute")
    return tag.of


def _readers(g: Graph, n: Node) -> list[int]:
    return list(dict.fromkeys(u for t in n.output_ids() for u in g.users(t)))


def why_not_deremat(g: Graph, order: Sequence[int], remat_node: int) -> str | None:
    """Why the users of recompute `remat_node` cannot read its original again (None: applies)."""
    return _why_not_deremat(g, order, remat_node)


def deremat(g: Graph, order: Sequence[int], remat_node: int) -> Rewrite:
    """The dual of remat: the users of A' read A's outputs again and A' is removed, with its
    control edges; views moved into A''s storages move back. Raises RuleError when not
    applicable (why_not_deremat's reason)."""
    reason = _why_not_deremat(g, order, remat_node)
    if reason:
        raise RuleError(reason)
    n2 = g.nodes[remat_node]
    a = g.nodes[_original(n2)]
    out_map = {t2: t for t, t2 in zip(a.outputs, n2.outputs, strict=True)
               if t2 is not None and t is not None}   # the same outputs are None (checked)
    storage_map = {g.tensors[t2].storage: g.tensors[t].storage for t2, t in out_map.items()}
    readers = _readers(g, n2)
    moves = [StorageMove(s2, s, 0, tuple(v for v in alias_closure(g, s2, readers)
                                         if v not in out_map))
             for s2, s in storage_map.items()]
    edit = GraphEditor(g)
    for u in readers:
        edit.rewire(u, out_map)
    apply_moves(edit, moves)
    gone = {remat_node}
    guarded = [m for m, preds in g.control.items() if m not in gone and gone.intersection(preds)]
    for m in guarded:
        edit.set_control(m, (p for p in g.control[m] if p not in gone))
    made = {g.tensors[t].storage for t in n2.output_ids()}
    edit.remove_nodes([remat_node])
    edit.remove_storages(made)
    return Rewrite(
        graph=edit.finish(), order=[x for x in order if x not in gone], added=(),
        changed=tuple(dict.fromkeys((*readers, *guarded))), removed=(remat_node,),
        description=f"drop recompute {describe_node(g, remat_node)}: its users read "
                    f"{describe_node(g, a.id)} again",
    )
