"""Host update: a parameter's optimizer update runs on the host (ZeRO-Offload's way), on its
optimizer state kept in host memory, with its gradient copied out once made.

For a parameter p with optimizer state s1..sk, the update U(p) is the optimizer-phase ops that
write p or its state, with the ops only they read (the moments' square root, the gradient
scaled by the clipping coefficient, ...). The rule runs U(p) on the host:

    before (device)                              after
    g = mm(...)               (backward)         g = mm(...)
                                                 g_host = peakcut.store(g)          d2h, once made
    lerp_(m, g, ..)           (update)           lerp_(m, g_host, ..)               on the host
    mul_(v, ..); addcmul_(v, g, g, ..)           mul_(v, ..); addcmul_(v, g_host, g_host, ..)
    d = sqrt(v) / c + eps                        d = sqrt(v) / c + eps              (host memory)
    mul_(p, ..); addcdiv_(p, m, d, ..)           p_host = peakcut.store(p)          d2h
                                                 mul_(p_host, ..); addcdiv_(p_host, m, d, ..)
                                                 peakcut.upload(p, p_host)          h2d, in place

- the state s1..sk becomes host-kept (Graph.host_inputs): it never comes to the device; a load
  and writeback of offload_state for it are removed;
- every device tensor U(p) reads (the gradient, a clipping coefficient) is copied to host memory
  once (peakcut.store); U(p)'s in-place writes of it land on that private copy;
- p itself: kept in host memory already (offload_param), U(p) updates the host tensor in place
  and its update-phase load and writeback are removed; else it lives on the device, U(p)
  updates a host copy and peakcut.upload copies the new value back in place after the update.
- stores, the ops of U(p) and the upload are placed EARLY: the host stream takes the updates
  in the order their gradients come (the last layer's first).

Device memory then never holds the state, nor the gradient after its copy (and the uses
before the update: clipping's norm), nor the update's temporaries. The host link carries the
gradient out, and p out and in when it lives on the device. The ops of U(p) run on the host
stream (simulate.streams: priced on the host's profile, cost.profiles.host_profile), as the
generated code's host worker thread runs them (codegen/host_update_code.py). On a CPU the host is
the device and the numbers are the same op for op; on a GPU the update's kernels are the CPU's,
which round like the GPU's element-wise kernels up to the last bit of each op.

Sites (update_sites): the parameters whose update still runs on the device, with the device
bytes freed at a step of the order (the memory peak: state on the device, and the gradient or
update copies live there); the rule (peakcut.rules.host_update_rule) tries most bytes first.

Refused (why_not): a step with a GradScaler gate (its early return would leave host work
behind), `accumulate=k` (p.grad lives on the device), an op of U(p) PyTorch cannot run into a
given host buffer (no out= overload), a random or unknown op, a result of U(p) read outside it,
a device tensor it writes that does not fill its storage.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.ops import GATE_OP, LOAD_OP, STORE_OP, UPLOAD_OP, WRITEBACK_OP, is_host_copy
from peakcut.ir.registry import draws_random, lookup, out_variant
from peakcut.ir.tags import HostTag, NodeTags
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    StorageMove,
    apply_moves,
    check_order_matches,
    describe_node,
    describe_tensor,
    moved_meta,
    positions,
    spliced,
)
from peakcut.transform.swap import is_dense


@dataclass(frozen=True)
class UpdatePlan:
    """What the rewrite of parameter `param` does (see module doc).

    update: U(p), in capture order. host_kept: program inputs U(p) reads or writes that become
    host-kept (the state; p when it is kept in host memory already). unloaded: update-phase
    input copies (load output -> the host input it copies), read by U(p) instead of the input.
    removed: those loads and the writebacks of the host-kept inputs. stored: device tensors U(p)
    reads, each copied to host memory once. upload: whether p lives on the device (its new
    value goes back there after the update).
    """

    param: int
    update: tuple[int, ...]
    host_kept: tuple[int, ...]
    unloaded: Mapping[int, int]
    removed: tuple[int, ...]
    stored: tuple[int, ...]
    upload: bool


class Facts:
    """What the rule reads of a whole graph, found in one pass (each plan reads it again)."""

    def __init__(self, g: Graph) -> None:
        self.names = dict(zip(g.inputs, g.input_names, strict=True))
        self.state: dict[str, list[int]] = {}           # parameter name -> its state inputs
        for t, name in self.names.items():
            if name.startswith("state:"):
                pname, _, slot = name.removeprefix("state:").rpartition(".")
                self.state.setdefault(pname, []).append(t)
        self.gate = False
        self.host_updated: set[int] = set()
        self.copies: dict[int, dict[int, int]] = {}     # input -> {its update-phase load's output: input}
        self.copy_nodes: dict[int, list[int]] = {}      # input -> those loads and its writebacks
        for nid, node in g.nodes.items():
            if node.op == GATE_OP:
                self.gate = True
            elif (host := node.tags.get(HostTag)) is not None:
                self.host_updated.add(host.param)
            elif node.op == LOAD_OP and node.phase is Phase.OPTIMIZER and node.input_tuple[0] in self.names:
                x = node.input_tuple[0]
                self.copies.setdefault(x, {})[node.output_tuple[0]] = x
                self.copy_nodes.setdefault(x, []).append(nid)
            elif node.op == WRITEBACK_OP:
                self.copy_nodes.setdefault(node.input_tuple[0], []).append(nid)
        self.position = positions(g.order)
        self.inputs_in = Counter(g.tensors[t].storage for t in g.inputs)   # storage -> inputs in it
        self.returned = g.output_storages()

    def param_name(self, t: int) -> str | None:
        name = self.names.get(t, "")
        return name.removeprefix("param:") if name.startswith("param:") else None


def is_host_updated(g: Graph, param: int) -> bool:
    """True when parameter input `param`'s update runs on the host in g."""
    return any((tag := n.tags.get(HostTag)) is not None and tag.param == param for n in g.nodes.values())


def _movable(g: Graph, nid: int) -> bool:
    """An optimizer-phase op that may join an update on the host (more checks in _why_not_op)."""
    node = g.nodes[nid]
    return node.phase is Phase.OPTIMIZER and not is_host_copy(node.op) and node.op != GATE_OP \
        and node.tags.get(HostTag) is None


def _closure(g: Graph, seeds: Iterable[int], returned: set[int]) -> set[int]:
    """The seeds and, transitively, the optimizer-phase ops whose every result only they read
    (but for an op writing what the step returns (`returned` storages), a gradient clipped in
    place: it stays)."""
    update = set(seeds)
    frontier = list(update)
    while frontier:
        nid = frontier.pop()
        for t in g.nodes[nid].input_tuple:
            q = g.producer(t)
            if q is None or q in update or not _movable(g, q):
                continue
            if any(g.tensors[w].storage in returned for w in g.nodes[q].mutated_ids()):
                continue
            outs = g.nodes[q].output_tuple
            if outs and all(o not in g.outputs and set(g.users(o)) <= update for o in outs):
                update.add(q)
                frontier.append(q)
    return update


def _why_not_op(g: Graph, nid: int) -> str | None:
    node = g.nodes[nid]
    what = describe_node(g, nid)
    info = lookup(node.op)
    if info is None:
        return f"{what} is opaque to peakcut: it never moves to the host"
    if draws_random(node.op, node.args, node.kwargs):
        return f"{what} draws random numbers"
    if node.multi_output or len(node.outputs) > 1:
        return f"{what} has several results"
    if any(isinstance(v, torch.device) for v in (*node.args, *node.kwargs.values())):
        return f"{what} names a device: it would make its result there, not on the host"
    if node.allocates() and out_variant(node.op) is None:
        return f"{what} has no out= overload to write its result into a host buffer"
    return None


def plan_update(g: Graph, t: int, facts: Facts | None = None) -> UpdatePlan | str:
    """The rewrite for parameter input `t`, or why it does not apply (facts: Facts(g))."""
    if t not in g.tensors or t not in g.inputs:
        return f"tensor {t} is not a program input"
    facts = Facts(g) if facts is None else facts
    meta = g.tensors[t]
    what = describe_tensor(g, t)
    name = facts.param_name(t)
    if meta.role is not Role.PARAM or name is None:
        return f"{what} is not a parameter ({meta.role.value})"
    if f"acc:{name}" in g.input_names:
        return f"{what}: the step adds to its p.grad in place (accumulate=k), which lives on the device"
    if facts.gate:
        return f"{what}: a GradScaler step returns early when it skips the update, leaving host work behind"
    if t in facts.host_updated:
        return f"{what} is updated on the host already"
    state = facts.state.get(name, [])
    kept = [t, *state]
    copies = {y: x for k in kept for y, x in facts.copies.get(k, {}).items()}
    copy_nodes = [n for k in kept for n in facts.copy_nodes.get(k, [])]
    home = {g.tensors[x].storage for x in kept} | {g.tensors[y].storage for y in copies}
    seeds = [nid for s in home for nid in g.storage_writers(s) if _movable(g, nid)]
    if not seeds:
        return f"{what} is not updated by the step's optimizer"
    update = _closure(g, seeds, facts.returned)
    removable = set(copy_nodes)
    for nid in sorted(update):
        reason = _why_not_op(g, nid)
        if reason:
            return f"{what}: {reason}"
        for o in g.nodes[nid].output_tuple:
            outside = [u for u in g.users(o) if u not in update and u not in removable]
            if outside or o in g.outputs:
                return (f"{what}: {describe_tensor(g, o)} of its update is read outside it "
                        f"({describe_node(g, outside[0]) if outside else 'a program output'})")
    for x in state:
        touching = {*g.users(x), *g.storage_writers(g.tensors[x].storage)}
        if touching - update - removable:
            other = min(touching - update - removable)
            return f"{describe_tensor(g, x)} is used outside the update ({describe_node(g, other)})"
        if not _fills_storage(g, x):
            return f"{describe_tensor(g, x)} is not a dense tensor filling its storage"
        if facts.inputs_in[g.tensors[x].storage] > 1:
            return f"{describe_tensor(g, x)} shares its storage with another program input"
    on_device = not g.is_host_storage(meta.storage)
    stored: list[int] = []
    seen_storages: dict[int, int] = {}
    produced = {o for nid in update for o in g.nodes[nid].output_tuple}
    written = {g.tensors[w].storage for nid in update for w in g.nodes[nid].mutated_ids()}
    pos = facts.position
    first = min(pos[n] for n in update)
    for nid in sorted(update, key=pos.__getitem__):
        for x in g.nodes[nid].input_tuple:
            if x in produced or x in copies or x in state or (x == t and not on_device):
                continue
            xm = g.tensors[x]
            if g.is_host_storage(xm.storage):
                return f"{what}: its update reads {describe_tensor(g, x)}, in host memory already"
            if x in seen_storages or xm.storage in seen_storages.values():
                if x not in seen_storages:
                    return f"{what}: its update reads two tensors of one storage ({describe_tensor(g, x)})"
                continue
            if not is_dense(xm.shape, xm.stride):
                return f"{what}: its update reads {describe_tensor(g, x)}, which is not dense"
            if xm.storage in written:
                if not _fills_storage(g, x):
                    return f"{what}: its update writes {describe_tensor(g, x)}, which does not fill its storage"
                if xm.storage in facts.returned:
                    return (f"{what}: its update writes {describe_tensor(g, x)}, which the step returns "
                            "(the caller would not see the write)")
            # its copy is taken after every other write of the storage (a fission region's merges
            # write a gradient in place after the tensor the update names is made): none may
            # come after the update
            late = [w for w in g.storage_writers(xm.storage) if w not in update and pos[w] > first]
            if late:
                return f"{what}: {describe_node(g, late[0])} writes {describe_tensor(g, x)} after its update"
            seen_storages[x] = xm.storage
            stored.append(x)
    if not on_device and not _fills_storage(g, t):
        return f"{what} is not a dense tensor filling its storage"
    host_kept = tuple(state if on_device else kept)
    ordered = tuple(sorted(update, key=pos.__getitem__))
    return UpdatePlan(t, ordered, host_kept, copies, tuple(copy_nodes), tuple(stored), on_device)


def _fills_storage(g: Graph, x: int) -> bool:
    m = g.tensors[x]
    return is_dense(m.shape, m.stride) and not m.storage_offset and g.storages[m.storage] == m.nbytes


def update_sites(g: Graph, step: int, live: set[int]) -> list[tuple[int, tuple[int, ...], int]]:
    """(parameter input, the nodes that write it or its state, device bytes its update on the
    host frees at `step`) for every parameter whose update runs on the device; `live`: the
    storages live at `step`. A parameter that frees nothing there is listed too (it may still
    save its update's copies)."""
    facts = Facts(g)
    found = []
    for t, name in facts.names.items():
        if not name.startswith("param:") or t in facts.host_updated:
            continue
        state = facts.state.get(name.removeprefix("param:"), [])
        freed = sum(g.tensors[x].nbytes for x in state if not g.is_host_storage(g.tensors[x].storage))
        freed += sum(g.storages[g.tensors[y].storage] for k in (t, *state) for y in facts.copies.get(k, {})
                     if g.tensors[y].storage in live)
        # what the update reads that the step made (the gradient), where live at the step
        home = {g.tensors[x].storage for x in (t, *state)}
        home |= {g.tensors[y].storage for k in (t, *state) for y in facts.copies.get(k, {})}
        seeds = [n for h in home for n in g.storage_writers(h) if _movable(g, n)]
        made = {x: g.producer(x) for n in seeds for x in g.nodes[n].input_tuple}
        read = {g.tensors[x].storage for x, q in made.items()
                if q is not None and g.nodes[q].phase is not Phase.OPTIMIZER}
        freed += sum(g.storages[s] for s in read & live)
        if seeds:
            found.append((t, tuple(sorted(seeds)), freed))
    return found


def why_not_update_on_host(g: Graph, order: Sequence[int], t: int, facts: Facts | None = None) -> str | None:
    """Why parameter input `t`'s update cannot run on the host in (g, order); None when it can
    (facts: Facts(g), for many parameters of one graph)."""
    stale = check_order_matches(g, order)
    if stale:
        return stale
    plan = plan_update(g, t, facts)
    return plan if isinstance(plan, str) else None


def update_on_host(g: Graph, order: Sequence[int], plans: Sequence[UpdatePlan], description: str) -> Rewrite:
    """Apply `plans` (see UpdatePlan; of distinct parameters, judged on g) to (g, order) in one edit."""
    edit = GraphEditor(g)
    after: dict[int, list[int]] = {}        # added node -> the nodes it goes right after
    added: list[int] = []
    removed: set[int] = set()
    changed: list[int] = []
    for plan in plans:
        _rewrite_one(g, edit, plan, after, added, removed)
        changed.extend(plan.update)

    edit.set_order(spliced(edit.graph.order, removed, after))
    return Rewrite(graph=edit.finish(), order=spliced(order, removed, after), added=tuple(added), changed=tuple(changed),
                   removed=tuple(sorted(removed)), description=description)


def _rewrite_one(g: Graph, edit: GraphEditor, plan: UpdatePlan, after: dict[int, list[int]], added: list[int],
                 removed: set[int]) -> None:
    """Plan's edits in `edit` (whose graph holds the plans applied before); the nodes it adds
    go into `added`, and into `after` with the nodes each must follow."""
    t = plan.param
    update = set(plan.update)
    label = g.tensors[t].name or str(t)
    tag = HostTag(t, "update")
    mapping: dict[int, int] = dict(plan.unloaded)       # tensor U(p) read -> what it reads now
    moves: list[StorageMove] = []
    produced = [o for nid in plan.update for o in g.nodes[nid].output_tuple]

    def made_in(storage: int) -> tuple[int, ...]:
        return tuple(o for o in produced if g.tensors[o].storage == storage)

    # update-phase copies of host-kept inputs: U(p) works on the inputs themselves
    for y, x in plan.unloaded.items():
        moves.append(StorageMove(g.tensors[y].storage, g.tensors[x].storage, 0, made_in(g.tensors[y].storage)))
    # device tensors U(p) reads: a store each, after every other write of the storage
    for x in plan.stored:
        meta = g.tensors[x]
        storage = edit.add_storage(meta.nbytes)
        copy = TensorMeta(edit.new_id(), meta.shape, meta.stride, meta.dtype, storage, 0, Role.ACTIVATION,
                          f"{meta.name or x}_host")
        producer = g.producer(x)
        store = Node(id=edit.new_id(), op=STORE_OP, args=(TensorRef(x),), kwargs={}, outputs=(copy.id,),
                     module=g.nodes[producer].module if producer is not None else "",
                     phase=Phase.OPTIMIZER, name=f"store_{meta.name or x}", tags=NodeTags(HostTag(t, "store")))
        edit.add_node(store, [copy])
        others = [w for w in g.storage_writers(meta.storage) if w not in update and w != producer]
        if others:
            edit.set_control(store.id, others)
        after[store.id] = [q for q in (producer, *others) if q is not None]
        added.append(store.id)
        mapping[x] = copy.id
        moves.append(StorageMove(meta.storage, storage, meta.storage_offset * meta.itemsize, made_in(meta.storage)))
    for move in moves:
        for o in move.tensors:
            if moved_meta(g.tensors[o], move.new_storage, move.shift_bytes) is None:
                raise RuleError(f"internal: {describe_tensor(g, o)} cannot move into host memory")
    apply_moves(edit, moves)
    # the loads and writebacks U(p) no longer needs; the other loads of a host-kept input read it
    # before the update writes it
    gone = set(plan.removed)
    removed.update(gone)
    edit.remove_nodes(plan.removed)
    kept_loads = {x: [u for u in g.users(x) if g.nodes[u].op == LOAD_OP and u not in gone]
                  for x in plan.host_kept}
    for nid in {d for x in plan.host_kept for d in g.users(x)} | update:
        deps = edit.graph.control.get(nid, ()) if nid in edit.graph.nodes else ()
        if gone.intersection(deps):
            edit.set_control(nid, [d for d in deps if d not in gone])
    # U(p) on the host: rewired, tagged; its ops keep their control edges (an update runs
    # after the loss: a batch failing there leaves the state as it was) and follow the loads
    # of what they write
    writes_param: list[int] = []
    for nid in plan.update:
        node = edit.graph.nodes[nid]
        edit.replace_node(dataclasses.replace(node, tags=node.tags.with_tag(tag)))
        edit.rewire(nid, mapping)
        node = edit.graph.nodes[nid]
        targets = {edit.graph.tensors[w].storage for w in node.mutated_ids()}
        first = list(edit.graph.control.get(nid, ()))
        for x in plan.host_kept:
            if edit.graph.tensors[x].storage in targets:
                first.extend(kept_loads.get(x, ()))
        if g.tensors[t].storage in {g.tensors[w].storage for w in g.nodes[nid].mutated_ids()}:
            writes_param.append(nid)
        edit.set_control(nid, dict.fromkeys(first))
    if plan.upload:
        back = Node(id=edit.new_id(), op=UPLOAD_OP, args=(TensorRef(t), TensorRef(mapping[t])), kwargs={},
                    outputs=(None,), module=g.nodes[plan.update[-1]].module, phase=Phase.OPTIMIZER,
                    name=f"upload_{label}", tags=NodeTags(HostTag(t, "upload")))
        edit.add_node(back)
        readers = {d for nid in writes_param for d in g.control.get(nid, ()) if d not in update}
        edit.set_control(back.id, [*sorted(readers), *writes_param])
        after[back.id] = [*plan.update, *readers]
        added.append(back.id)
