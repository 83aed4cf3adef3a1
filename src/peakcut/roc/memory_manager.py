"""ROC's memory manager (Jia's thesis, §4.4): the exact dynamic program over execution states
and device-cached storages, as an oracle for the search's swaps on small graphs.

    plan = plan_cache(g, capacity)          # the least bytes moved between host and device
    plan.moved_bytes, plan.order, plan.steps

The model, in peakcut's memory terms (peakcut.memory.liveness, whose storage touches it reads):

- The unit is a storage: views and in-place results share their base's and add nothing. A
  node touches the storages of the tensors it reads and writes; it runs only with every
  storage it touches on the device (a view too: peakcut's views of a swapped tensor read the
  loaded copy).
- Program inputs (batch, parameters, buffers, optimizer state) are on the device for the whole
  step and never move, as peakcut never swaps what the caller holds: their bytes are a
  constant baseline. A program output's storage stays on the device from the node that
  allocates it to the end, as in peakcut (it is never swapped either).
- Every other storage (an activation) is allocated on the device by the node that first touches
  it (its producer) and may be evicted when it is not in use. Evicting one that no later node
  touches is free (it is dead). Evicting one still needed moves its bytes to the host unless
  the host already holds its current contents (it was loaded from there and nothing wrote it
  since): a write-back. A node that needs an evicted storage loads it first (its bytes again,
  host to device). In-place writes make the device copy the only current one.
- The bytes on the device while node v runs are the baseline, the program outputs allocated
  so far, the cached storages and every storage v touches (its outputs included); they must
  stay within the capacity. No workspace is counted (the search's side runs with
  workspace=None) and copies do not overlap compute: each load, write-back and node runs in
  turn, as in a peakcut timeline whose copies run in order.
- Moved bytes = loaded bytes + written-back bytes (storage sizes). On the search's side the
  same figure is what its plan's swap nodes move (host_traffic: each store's and each load's
  tensor bytes); a swapped tensor that fills its storage moves exactly the storage's bytes.

A state is (the nodes run, a set closed under the dependencies, control edges included; the
cached storages, pruned to those some node not run yet touches; the cached storages whose
host copy is stale or absent). From a state the program runs any ready node, evicting first a
set of cached storages it does not touch when the node would not fit otherwise. Only minimal
eviction sets are tried (no proper subset fits): an eviction put off until room is needed
costs no more (a dirty storage stays dirty, a clean one only gets dirty by a node that needs
it on the device anyway), so some optimal program evicts lazily. A ready node that touches
only storages on the device and allocates and writes nothing (a view) runs at once: it costs
nothing, needs no room and can only shorten lifetimes. The DP memoises the least bytes from
each state; the plan it returns is optimal in this model.

Refused, naming the node: graphs with more than `max_ops` nodes that are not views, ops the
registry does not know (their writes are unknown), and graphs that already keep storages in
host memory (swap or host nodes, host-kept inputs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.registry import OpKind, lookup
from peakcut.memory.liveness import storage_touches

MAX_OPS = 12
"""Nodes other than views a graph may have (the DP's states grow exponentially with them)."""

_INFEASIBLE = 1 << 62


class CapacityError(ValueError):
    """No program runs the graph within the capacity."""


@dataclass(frozen=True)
class Step:
    """One node of the plan and the copies before it (storage ids).

    evicted: storages dropped from the device before the node runs; write_backs: those among
    them copied to the host first; loads: storages copied to the device before it runs;
    cached: the activation storages on the device after it ran (program outputs not listed);
    device_bytes: the bytes on the device while it runs."""

    node: int
    evicted: tuple[int, ...]
    write_backs: tuple[int, ...]
    loads: tuple[int, ...]
    cached: tuple[int, ...]
    device_bytes: int


@dataclass(frozen=True)
class CachePlan:
    """The DP's optimum: bytes moved (loads + write-backs), the order and every step."""

    capacity: int
    moved_bytes: int
    loaded_bytes: int
    written_back_bytes: int
    order: tuple[int, ...]
    steps: tuple[Step, ...]
    peak_bytes: int
    states: int


def host_traffic(g: Graph) -> int:
    """Bytes a graph's swap nodes move between device and host: every store's and every
    load's output tensor (the search's side of the comparison with plan_cache)."""
    return sum(g.tensors[t].nbytes for n in g.nodes.values() if n.op in (STORE_OP, LOAD_OP)
               for t in n.output_tuple)


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Model:
    """The graph as bitmasks: nodes by position in g.order, storages by liveness index."""

    def __init__(self, g: Graph, max_ops: int) -> None:
        _check_graph(g, max_ops)
        self.ids = list(g.order)
        pos = {nid: i for i, nid in enumerate(self.ids)}
        n = len(self.ids)
        touches = storage_touches(g, self.ids)
        self.storage_ids = list(touches.storages)
        self.size = [int(b) for b in touches.size]
        self.baseline = int(touches.baseline)
        m = len(self.storage_ids)
        index = {s: k for k, s in enumerate(self.storage_ids)}
        self.touch = [0] * n
        self.toucher = [0] * m
        for k, v in zip(touches.touch_storage.tolist(), touches.touch_node.tolist(), strict=True):
            self.touch[v] |= 1 << k
            self.toucher[k] |= 1 << v
        self.pinned = sum(1 << k for k in range(m) if touches.to_end[k])
        producer = g.producer_map()
        self.alloc = [0] * n
        for k, owner in enumerate(touches.owner):
            self.alloc[pos[producer[owner]]] |= 1 << k
        self.preds = [sum(1 << pos[p] for p in g.predecessors(nid)) for nid in self.ids]
        self.written = [self.alloc[v] | sum(1 << index[s] for t in g.nodes[nid].mutated_ids()
                                            if (s := g.tensors[t].storage) in index)
                        for v, nid in enumerate(self.ids)]
        self.view = [_is_view(g.nodes[nid].op) and not self.written[v] for v, nid in enumerate(self.ids)]
        self.full = (1 << n) - 1

    def bytes(self, mask: int) -> int:
        return sum(self.size[k] for k in _bits(mask))

    def needed(self, done: int) -> int:
        """Storages some node not in `done` touches."""
        left = self.full & ~done
        return sum(1 << k for k, users in enumerate(self.toucher) if users & left)

    def allocated(self, done: int) -> int:
        return _or(self.alloc[v] for v in _bits(done))

    def ready(self, done: int) -> list[int]:
        return [v for v in range(len(self.ids)) if not done >> v & 1 and self.preds[v] & ~done == 0]


def _or(masks: Iterator[int]) -> int:
    out = 0
    for x in masks:
        out |= x
    return out


def _is_view(op: str) -> bool:
    info = lookup(op)
    return info is not None and info.kind is OpKind.VIEW


def _check_graph(g: Graph, max_ops: int) -> None:
    """ValueError naming the node the model does not cover (module doc), or a bad max_ops."""
    if max_ops < 1:
        raise ValueError(f"max_ops={max_ops!r}: expected a number of ops >= 1")
    for nid in g.order:
        node = g.nodes[nid]
        if g.is_opaque(nid):
            raise ValueError(f"node {node.name} ({node.op}): the registry does not know the op, so "
                             "its in-place writes are unknown; the memory manager refuses the graph")
    host = g.host_storages()
    for nid in g.order:
        node = g.nodes[nid]
        if any(g.tensors[t].storage in host for t in (*node.input_tuple, *node.output_tuple)):
            raise ValueError(f"node {node.name} ({node.op}) touches host memory: the memory manager "
                             "plans a graph without swaps or host-kept storages")
    ops = [nid for nid in g.order if not _is_view(g.nodes[nid].op)]
    if len(ops) > max_ops:
        raise ValueError(f"the graph has {len(ops)} ops besides views (max_ops={max_ops}); the first "
                         f"beyond the limit is {g.nodes[ops[max_ops]].name}")


def _evictions(model: _Model, candidates: int, excess: int) -> Iterator[int]:
    """The minimal sets of `candidates` whose bytes cover `excess` (0: nothing to evict)."""
    if excess <= 0:
        yield 0
        return
    ks = list(_bits(candidates))
    if sum(model.size[k] for k in ks) < excess:
        return
    sub = candidates
    while sub:
        sizes = [model.size[k] for k in _bits(sub)]
        total = sum(sizes)
        if total >= excess and total - min(sizes) < excess:
            yield sub
        sub = (sub - 1) & candidates


class _Solver:
    """The memoised DP (module doc); best() returns bytes moved from a state to the end."""

    def __init__(self, model: _Model, capacity: int) -> None:
        self.m = model
        self.capacity = capacity
        self.memo: dict[tuple[int, int, int], int] = {}
        self.choice: dict[tuple[int, int, int], tuple[int, int]] = {}

    def device_bytes(self, done: int, cached: int, v: int) -> int:
        m = self.m
        pinned = m.allocated(done | 1 << v) & m.pinned
        return m.baseline + m.bytes(pinned | cached | (m.touch[v] & ~m.pinned))

    def closure(self, done: int, cached: int, dirty: int) -> tuple[int, int, int, list[int]]:
        """The state after every free view ran (module doc), and those views in order."""
        m = self.m
        ran: list[int] = []
        progress = True
        while progress:
            progress = False
            for v in m.ready(done):
                if m.view[v] and m.touch[v] & ~m.pinned & ~cached == 0:
                    done |= 1 << v
                    ran.append(v)
                    progress = True
            cached &= m.needed(done)
        return done, cached, dirty & cached, ran

    def transition(self, done: int, cached: int, dirty: int, v: int, evict: int
                   ) -> tuple[int, tuple[int, int, int]]:
        """Bytes moved by evicting `evict` and running v; the state after (before closure)."""
        m = self.m
        touched = m.touch[v] & ~m.pinned
        loads = touched & ~cached & m.allocated(done)
        cost = m.bytes(loads) + m.bytes(evict & dirty)
        after = done | 1 << v
        kept = (cached & ~evict | touched) & m.needed(after)
        return cost, (after, kept, ((dirty & ~evict) | m.written[v]) & kept)

    def options(self, done: int, cached: int) -> Iterator[tuple[int, int]]:
        """(node, eviction set) pairs that fit the capacity."""
        m = self.m
        for v in m.ready(done):
            touched = m.touch[v] & ~m.pinned
            excess = self.device_bytes(done, cached | touched, v) - self.capacity
            for evict in _evictions(m, cached & ~touched, excess):
                yield v, evict

    def best(self, done: int, cached: int, dirty: int) -> int:
        key = (done, cached, dirty)
        if done == self.m.full:
            return 0
        found = self.memo.get(key)
        if found is not None:
            return found
        best = _INFEASIBLE
        for v, evict in self.options(done, cached):
            cost, state = self.transition(done, cached, dirty, v, evict)
            after = self.closure(*state)[:3]
            total = cost + self.best(*after)
            if total < best:
                best = total
                self.choice[key] = (v, evict)
        self.memo[key] = best
        return best


def plan_cache(g: Graph, capacity: int, *, max_ops: int = MAX_OPS) -> CachePlan:
    """The least bytes moved between host and device to run `g` with at most `capacity` bytes
    on the device, with the order and the cache at every step (module doc: the model).

    Raises ValueError naming the node for a graph the model does not cover, CapacityError
    when no program fits the capacity."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity={capacity!r}: expected bytes, an int >= 0")
    model = _Model(g, max_ops)
    solver = _Solver(model, capacity)
    done, cached, dirty, ran = solver.closure(0, 0, 0)
    moved = solver.best(done, cached, dirty)
    if moved >= _INFEASIBLE:
        raise CapacityError(f"capacity={capacity} bytes: no order and caching runs the graph within it "
                            f"(the caller-held storages alone are {model.baseline} bytes)")
    return _replay(solver, capacity, moved, ran, (done, cached, dirty))


def _replay(solver: _Solver, capacity: int, moved: int, first: list[int],
            state: tuple[int, int, int]) -> CachePlan:
    """The plan behind the DP's optimum: its choices replayed from the start."""
    m = solver.m
    sid = m.storage_ids

    def names(mask: int) -> tuple[int, ...]:
        return tuple(sid[k] for k in _bits(mask))

    steps: list[Step] = []

    def free_steps(views: list[int], done: int, cached: int) -> None:
        for v in views:
            steps.append(Step(m.ids[v], (), (), (), names(cached), solver.device_bytes(done, cached, v)))

    free_steps(first, state[0], state[1])
    loaded = written = 0
    done, cached, dirty = state
    while done != m.full:
        v, evict = solver.choice[(done, cached, dirty)]
        touched = m.touch[v] & ~m.pinned
        loads = touched & ~cached & m.allocated(done)
        during = solver.device_bytes(done, (cached & ~evict) | touched, v)
        backs = evict & dirty
        loaded += m.bytes(loads)
        written += m.bytes(backs)
        _, after = solver.transition(done, cached, dirty, v, evict)
        done, cached, dirty, views = solver.closure(*after)
        steps.append(Step(m.ids[v], names(evict), names(backs), names(loads), names(after[1]), during))
        free_steps(views, done, cached)
    return CachePlan(capacity=capacity, moved_bytes=moved, loaded_bytes=loaded, written_back_bytes=written,
                     order=tuple(s.node for s in steps), steps=tuple(steps),
                     peak_bytes=max((s.device_bytes for s in steps), default=m.baseline),
                     states=len(solver.memo))
