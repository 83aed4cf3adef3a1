"""The straightforward implementations the fast paths replaced (as they were before the speed-up).

The tests in this package check that the fast paths give exactly what these give: the same
maps, lists in the same order, the same floats to the bit, the same hashes and the same
messages. Keep them simple and slow; do not "fix" them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.calls import is_swap, swap_transfer
from peakcut.cost.protocol import issue_seconds
from peakcut.ir.foreach import ForeachTag
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.node import Hyper, TensorRef, iter_refs
from peakcut.ir.ops import LOAD_OP, STORE_OP, is_swap_op
from peakcut.ir.registry import OpKind, argument_names, lookup, mutated_arguments
from peakcut.ir.tags import RematTag
from peakcut.memory import MemoryProfile, PeakStorage
from peakcut.simulate.streams import COMPUTE, STREAMS, StreamTiming, node_seconds, node_stream
from peakcut.simulate.timeline import Timeline
from peakcut.transform.rewrite import (
    alias_closure,
    describe_node,
    describe_tensor,
    program_output_storages,
    reads_any,
    why_not_move,
)
from peakcut.transform.swap import _why_not_stale, is_dense


# ------------------------------------------------------------------ Node and Graph queries
def input_ids(node) -> list[int]:
    seen: dict[int, None] = {}
    for ref in iter_refs(node.args):
        seen.setdefault(ref.id)
    for ref in iter_refs(node.kwargs):
        seen.setdefault(ref.id)
    return list(seen)


def output_ids(node) -> list[int]:
    return [t for t in node.outputs if t is not None]


def mutated_tensors(g: Graph, node: int) -> list[int]:
    n = g.nodes[node]
    written = mutated_arguments(n.op)
    if not written:
        return []
    names = argument_names(n.op)
    out: list[int] = []
    for name, value in zip(names, n.args, strict=False):
        if name in written:
            out.extend(r.id for r in iter_refs(value))
    for name, value in n.kwargs.items():
        if name in written:
            out.extend(r.id for r in iter_refs(value))
    return out


def producer_map(g: Graph) -> dict[int, int]:
    return {t: n.id for n in g.nodes.values() for t in output_ids(n)}


def users_map(g: Graph) -> dict[int, list[int]]:
    users: dict[int, list[int]] = {}
    for nid in g.order:
        for t in input_ids(g.nodes[nid]):
            users.setdefault(t, []).append(nid)
    return users


def predecessors(g: Graph, node: int, producer: dict[int, int] | None = None) -> set[int]:
    producer = producer_map(g) if producer is None else producer
    preds = {p for t in input_ids(g.nodes[node]) if (p := producer.get(t)) is not None}
    preds.update(g.control.get(node, ()))
    preds.discard(node)
    return preds


def writers_map(g: Graph) -> dict[int, list[int]]:
    writers: dict[int, list[int]] = {}
    for nid in g.order:
        for t in mutated_tensors(g, nid):
            found = writers.setdefault(g.tensors[t].storage, [])
            if nid not in found:
                found.append(nid)
    return writers


def storage_owner(g: Graph) -> dict[int, int]:
    held = {g.tensors[t].storage for t in g.inputs}
    owner: dict[int, int] = {}
    for nid in g.order:
        for t in output_ids(g.nodes[nid]):
            s = g.tensors[t].storage
            if s not in held and s not in owner:
                owner[s] = nid
    return owner


def host_storages(g: Graph) -> set[int]:
    return {g.tensors[t].storage for n in g.nodes.values() if n.op == STORE_OP or n.tags.on_host
            for t in output_ids(n)}


def positions(order: Sequence[int]) -> dict[int, int]:
    return {nid: i for i, nid in enumerate(order)}


def check_order_matches(g: Graph, order: Sequence[int]) -> str | None:
    if len(order) != len(g.nodes) or set(order) != set(g.nodes):
        return f"the order has {len(order)} nodes but the graph has {len(g.nodes)} (a stale order?)"
    return None


# ------------------------------------------------------------------ cost
def tensor_layout(meta) -> str:
    shape = ",".join(str(s) for s in meta.shape)
    stride = ",".join(str(s) for s in meta.stride)
    return f"T[{shape};{stride};{meta.dtype}]"


def _render(value: Any, g: Graph) -> str:
    if isinstance(value, TensorRef):
        return tensor_layout(g.tensors[value.id])
    if isinstance(value, Hyper):
        return "hyper"
    if isinstance(value, torch.device):
        return "device"
    if isinstance(value, list):
        return "[" + ", ".join(_render(v, g) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v, g) for v in value) + ")"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{k}: {_render(v, g)}" for k, v in items) + "}"
    return repr(value)


def call_key(g: Graph, nid: int) -> str:
    node = g.nodes[nid]
    args = [_render(a, g) for a in node.args]
    kwargs = [f"{k}={_render(v, g)}" for k, v in sorted(node.kwargs.items())]
    return f"{node.op}({', '.join(args + kwargs)})"


class ReferenceAnalytic(AnalyticCostModel):
    """The analytic model as it was: a call-key cache only, the key rendered on every call."""

    def _whole(self, g: Graph, nid: int) -> float:
        if is_swap(g, nid):
            return self.copy_seconds(*swap_transfer(g, nid))
        key = call_key(g, nid)
        seconds = self._seconds.get(key)
        if seconds is None:
            seconds = self._node_estimate(g, nid)
            self._seconds[key] = seconds
        run = g.nodes[nid].tags.get(ForeachTag)
        if run is not None and run.size > 1:
            seconds -= self.profile.launch_seconds * (1 - 1 / run.size)
        return seconds

    def issue_seconds(self, g: Graph, nid: int) -> float:
        p = self.profile
        if not p.asynchronous:
            return 0.0
        info = lookup(g.nodes[nid].op)
        if info is not None and info.kind is OpKind.VIEW and not is_swap(g, nid):
            return p.view_seconds
        run = g.nodes[nid].tags.get(ForeachTag)
        if run is not None and run.size > 1:
            return p.launch_seconds / run.size
        return p.launch_seconds

    def node_seconds(self, g: Graph, nid: int) -> float:
        return self._whole(g, nid) - self.issue_seconds(g, nid)


# ------------------------------------------------------------------ computation hash
def computation_hash(g: Graph, order: list[int] | None = None) -> str:
    order = list(g.order if order is None else order)
    tensor_hash: dict[int, str] = {t: f"in:{name}" for t, name in zip(g.inputs, g.input_names, strict=True)}
    node_hash: dict[int, str] = {}

    def arg(value: Any) -> Any:
        if isinstance(value, TensorRef):
            return tensor_hash.get(value.id, f"?{value.id}")
        if isinstance(value, (list, tuple)):
            return tuple(arg(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, arg(v)) for k, v in value.items()))
        return repr(value)

    for nid in order:
        node = g.nodes[nid]
        key = repr((node.op, arg(node.args), arg(node.kwargs),
                    tuple(sorted(node_hash.get(c, "?") for c in g.control.get(nid, ())))))
        h = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
        node_hash[nid] = h
        for i, t in enumerate(node.outputs):
            if t is not None:
                tensor_hash[t] = f"{h}:{i}"
    outputs = tuple(tensor_hash.get(t, "?") for t in g.outputs)
    whole = repr((sorted(node_hash.values()), outputs))
    return hashlib.blake2b(whole.encode(), digest_size=16).hexdigest()


# ------------------------------------------------------------------ workspace
def node_workspace(g: Graph, nid: int, model: str, calibrated: Any = None) -> int:
    """"cpu-rules": the rules called on the node's metas; "cpu": the calibrated model asked
    about this one node (no graph or node caches), the rules where it cannot measure.
    `calibrated`: the model "cpu" resolves to, when the caller resolved it once for a whole
    order (resolving it hashes the machine's fingerprint: 0.1 ms a node)."""
    from peakcut.ir.node import map_refs
    from peakcut.memory.workspace import cpu_workspace_bytes, workspace_model, workspace_ops

    if model not in ("cpu", "cpu-rules"):
        raise ValueError(f"unknown workspace model {model!r}")
    node = g.nodes[nid]

    def rules(_node: object = None) -> int:
        if node.op not in workspace_ops():
            return 0
        args = map_refs(node.args, lambda r: g.tensors[r.id].to_meta())
        kwargs = map_refs(node.kwargs, lambda r: g.tensors[r.id].to_meta())
        outs = [g.tensors[t].to_meta() for t in output_ids(node)]
        return int(cpu_workspace_bytes(node.overload(), tuple(args), kwargs, outs))

    if model == "cpu-rules":
        return rules()
    calibrated = workspace_model("cpu") if calibrated is None else calibrated
    return calibrated.nodes_bytes(g, [node], rules)[0] if calibrated.applies(node.op) else 0


def _calibrated(model: str) -> Any:
    """The model "cpu" resolves to, once per simulated order (None for the rules)."""
    from peakcut.memory.workspace import workspace_model

    return workspace_model("cpu") if model == "cpu" else None


# ------------------------------------------------------------------ step memory simulation
def simulate(g: Graph, order: list[int] | None = None, workspace: str | None = "cpu") -> MemoryProfile:
    order_t = tuple(g.order if order is None else order)
    if len(order_t) != len(g.nodes):
        raise GraphError(f"order has {len(order_t)} nodes, graph has {len(g.nodes)}")
    n = len(order_t)
    held = {g.tensors[t].storage for t in g.inputs}
    outs = {g.tensors[t].storage for t in g.outputs}
    host = host_storages(g)
    alloc: dict[int, int] = {}
    free: dict[int, int] = {}
    for i, nid in enumerate(order_t):
        node = g.nodes[nid]
        for t in output_ids(node):
            s = g.tensors[t].storage
            if s not in held and s not in alloc and s not in host:
                alloc[s] = i
                free[s] = i
        for t in input_ids(node):
            s = g.tensors[t].storage
            if s in free and free[s] < i:
                free[s] = i
    for s in outs:
        if s in free:
            free[s] = n - 1
    delta = np.zeros(n + 1, dtype=np.int64)
    for s, a in alloc.items():
        b = g.storages[s]
        delta[a] += b
        delta[free[s] + 1] -= b
    baseline = sum(g.storages[s] for s in held)
    ws = np.zeros(n, dtype=np.int64)
    if workspace is not None:
        calibrated = _calibrated(workspace)
        for i, nid in enumerate(order_t):
            ws[i] = node_workspace(g, nid, workspace, calibrated)
    timeline = np.cumsum(delta[:n]) + baseline + ws
    peak_index = int(np.argmax(timeline)) if n else 0
    peak = int(timeline[peak_index]) if n else baseline
    lifetime = {s: (alloc[s], free[s]) for s in alloc}
    lifetime.update({s: (-1, n) for s in held})
    owner_tensor: dict[int, int] = {}
    for t in g.inputs:
        owner_tensor.setdefault(g.tensors[t].storage, t)
    for nid in order_t:
        for t in output_ids(g.nodes[nid]):
            owner_tensor.setdefault(g.tensors[t].storage, t)
    producer = producer_map(g)
    hot = []
    for s, (a, f) in lifetime.items():
        if a <= peak_index <= f:
            t = owner_tensor.get(s)
            meta = g.tensors[t] if t is not None else None
            prod = producer.get(t) if t is not None else None
            hot.append(PeakStorage(
                storage=s, bytes=g.storages[s], tensor=meta.name if meta else str(s),
                module=g.nodes[prod].module if prod is not None else "",
                role=meta.role.value if meta else "",
                phase=g.nodes[prod].phase.value if prod is not None else "", node=prod,
            ))
    hot.sort(key=lambda h: -h.bytes)
    return MemoryProfile(order_t, timeline, peak, peak_index, baseline, lifetime, ws, tuple(hot))


# ------------------------------------------------------------------ timeline simulation
@dataclass(frozen=True)
class StorageLife:
    """alloc[s]: position allocating s; last[s]: position freeing it (None: never); held."""

    alloc: dict[int, int]
    last: dict[int, int | None]
    held: frozenset[int]


@dataclass(frozen=True)
class MemoryCurve:
    """The old curve: bytes after each event, each node's start/end point, the lives."""

    times: np.ndarray
    bytes: np.ndarray
    baseline_bytes: int
    start_index: np.ndarray
    end_index: np.ndarray
    lives: StorageLife


def make_schedule(g: Graph, order: Sequence[int] | None) -> tuple:
    """(order, position, inputs, outputs, preds) with lists, as the old Schedule held them."""
    order_t = tuple(g.order if order is None else order)
    position: dict[int, int] = {}
    for i, nid in enumerate(order_t):
        if nid not in g.nodes:
            raise GraphError(f"order names node {nid}, which is not in the graph")
        if nid in position:
            raise GraphError(f"order runs node {nid} twice")
        position[nid] = i
    if len(position) != len(g.nodes):
        raise GraphError("order leaves out nodes")
    producer = producer_map(g)
    inputs, outputs, preds = [], [], []
    for i, nid in enumerate(order_t):
        node = g.nodes[nid]
        reads = input_ids(node)
        deps: dict[int, None] = {}
        for t in reads:
            p = producer.get(t)
            if p is not None:
                deps[p] = None
        for p in g.control.get(nid, ()):
            deps[p] = None
        deps.pop(nid, None)
        pred_pos: list[int] = []
        for p in deps:
            j = position.get(p)
            if j is None:
                raise GraphError(f"depends on unknown node {p}")
            if j > i:
                raise GraphError(f"order runs {nid} before {p}")
            pred_pos.append(j)
        inputs.append(reads)
        outputs.append(output_ids(node))
        preds.append(pred_pos)
    return order_t, position, inputs, outputs, preds


def time_streams(g: Graph, schedule: tuple, cost) -> StreamTiming:
    order, _, _, _, all_preds = schedule
    overlap = bool(cost.overlap_copies)
    n = len(order)
    seconds = node_seconds(g, order, cost).tolist()
    issue = np.array([issue_seconds(cost, g, nid) if not g.nodes[nid].tags.on_host else 0.0 for nid in order],
                     dtype=np.float64)
    issued = np.cumsum(issue).tolist()
    start = [0.0] * n
    end = [0.0] * n
    streams: list[str] = []
    on_copy_stream = [False] * n
    stream_free = dict.fromkeys(STREAMS, 0.0)
    exposed = 0.0
    for i, nid in enumerate(order):
        op = g.nodes[nid].op
        stream = node_stream(op, overlap, g.nodes[nid].tags.on_host)
        compute_free = stream_free[COMPUTE]
        if stream == COMPUTE:
            ready = max(compute_free, issued[i])
            begin = ready
            for p in all_preds[i]:
                if on_copy_stream[p] and end[p] > begin:
                    begin = end[p]
            exposed += begin - ready
            if not overlap and op in (STORE_OP, LOAD_OP):
                exposed += seconds[i]
        else:
            begin = stream_free[stream] if stream == "host" else max(stream_free[stream], compute_free, issued[i])
            for p in all_preds[i]:
                begin = max(begin, end[p])
            on_copy_stream[i] = True
        start[i] = begin
        end[i] = begin + seconds[i]
        stream_free[stream] = end[i]
        streams.append(stream)
    return StreamTiming(np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64),
                        tuple(streams), float(exposed))


def storage_lives(g: Graph, schedule: tuple, timing: StreamTiming) -> StorageLife:
    order, _, inputs, outputs, _ = schedule
    held = {g.tensors[t].storage for t in g.inputs}
    skip = held | host_storages(g)
    outs = {g.tensors[t].storage for t in g.outputs}
    end = timing.end.tolist()
    alloc: dict[int, int] = {}
    last: dict[int, int] = {}
    for i in range(len(order)):
        for t in outputs[i]:
            s = g.tensors[t].storage
            if s not in skip and s not in alloc:
                alloc[s] = i
                last[s] = i
        for t in (*outputs[i], *inputs[i]):
            s = g.tensors[t].storage
            j = last.get(s)
            if j is not None and (end[i] > end[j] or (end[i] == end[j] and i > j)):
                last[s] = i
    lasts = {s: (None if s in outs else j) for s, j in last.items()}
    return StorageLife(alloc=alloc, last=lasts, held=frozenset(held))


def memory_curve(g: Graph, schedule: tuple, timing: StreamTiming, workspace: str | None) -> MemoryCurve:
    order = schedule[0]
    n = len(order)
    lives = storage_lives(g, schedule, timing)
    ws = np.zeros(n, dtype=np.int64)
    if workspace is not None:
        calibrated = _calibrated(workspace)
        for i, nid in enumerate(order):
            ws[i] = node_workspace(g, nid, workspace, calibrated)
    on_start = ws.copy()
    on_end = -ws
    for s, a in lives.alloc.items():
        size = g.storages[s]
        on_start[a] += size
        f = lives.last[s]
        if f is not None:
            on_end[f] -= size
    baseline = sum(g.storages[s] for s in lives.held)
    times = np.concatenate([timing.start, timing.end])
    position = np.arange(n, dtype=np.int64)
    seq = np.concatenate([2 * position, 2 * position + 1])
    perm = np.lexsort((seq, times))
    deltas = np.concatenate([on_start, on_end])[perm]
    curve = np.empty(2 * n + 1, dtype=np.int64)
    curve[0] = baseline
    np.cumsum(deltas, out=curve[1:])
    curve[1:] += baseline
    curve_times = np.empty(2 * n + 1, dtype=np.float64)
    curve_times[0] = 0.0
    curve_times[1:] = times[perm]
    point = np.empty(2 * n, dtype=np.int64)
    point[perm] = np.arange(1, 2 * n + 1, dtype=np.int64)
    return MemoryCurve(curve_times, curve, int(baseline), point[:n], point[n:], lives)


def hotspots(g: Graph, schedule: tuple, curve: MemoryCurve, k: int) -> tuple[PeakStorage, ...]:
    order, _, _, outputs, _ = schedule
    owner: dict[int, int] = {}
    for t in g.inputs:
        owner.setdefault(g.tensors[t].storage, t)
    live = list(curve.lives.held)
    for s, a in curve.lives.alloc.items():
        f = curve.lives.last[s]
        if curve.start_index[a] <= k and (f is None or curve.end_index[f] > k):
            live.append(s)
    for s in live:
        a = curve.lives.alloc.get(s)
        if a is not None:
            owner[s] = next(t for t in outputs[a] if g.tensors[t].storage == s)
    spots = []
    for s in live:
        t = owner.get(s)
        meta = g.tensors[t] if t is not None else None
        a = curve.lives.alloc.get(s)
        producer = g.nodes[order[a]] if a is not None else None
        spots.append(PeakStorage(
            storage=s, bytes=g.storages[s], tensor=meta.name if meta else str(s),
            module=producer.module if producer else "", role=meta.role.value if meta else "",
            phase=producer.phase.value if producer else "", node=producer.id if producer else None,
        ))
    spots.sort(key=lambda h: -h.bytes)
    return tuple(spots)


def simulate_timeline(g: Graph, order: Sequence[int] | None, cost, workspace: str | None = "cpu") -> Timeline:
    schedule = make_schedule(g, order)
    timing = time_streams(g, schedule, cost)
    curve = memory_curve(g, schedule, timing, workspace)
    k = int(np.argmax(curve.bytes))
    on_compute = np.fromiter((st == COMPUTE for st in timing.stream), dtype=bool, count=len(timing.stream))
    running = np.flatnonzero(on_compute & (curve.start_index <= k) & (k < curve.end_index))
    return Timeline(
        order=schedule[0], cost_name=cost.name, latency_seconds=timing.latency_seconds,
        start=timing.start, end=timing.end, stream=timing.stream, times=curve.times, bytes=curve.bytes,
        peak_bytes=int(curve.bytes[k]), peak_time=float(curve.times[k]),
        peak_node=schedule[0][int(running[0])] if len(running) else None,
        baseline_bytes=curve.baseline_bytes, hotspots=hotspots(g, schedule, curve, k),
        exposed_copy_seconds=timing.exposed_copy_seconds, position=schedule[1],
        start_index=curve.start_index, end_index=curve.end_index,
    )


# ------------------------------------------------------------------ placement
def place(g: Graph, order: list[int], cost=None) -> list[int]:
    order = list(order)
    for nid in [n for n in order if g.nodes[n].op == STORE_OP]:
        order = _move_early(g, order, nid)
    for nid in [n for n in order if g.nodes[n].tags.get(RematTag) is not None]:
        order = _move_late(g, order, nid, 0.0, cost)
    for nid in [n for n in order if g.nodes[n].op == LOAD_OP]:
        seconds = cost.node_seconds(g, nid) if cost is not None and cost.overlap_copies else 0.0
        order = _move_late(g, order, nid, seconds, cost)
    return order


def _successors(g: Graph, nid: int) -> set[int]:
    users = users_map(g)
    out = {u for t in output_ids(g.nodes[nid]) for u in users.get(t, [])}
    out |= {n for n, deps in g.control.items() if nid in deps}
    out.discard(nid)
    return out


def _move_early(g: Graph, order: list[int], nid: int) -> list[int]:
    preds = predecessors(g, nid)
    rest = [n for n in order if n != nid]
    at = max((i for i, n in enumerate(rest) if n in preds), default=-1) + 1
    return rest[:at] + [nid] + rest[at:]


def _move_late(g: Graph, order: list[int], nid: int, hide_seconds: float, cost) -> list[int]:
    succs = _successors(g, nid)
    preds = predecessors(g, nid)
    rest = [n for n in order if n != nid]
    first_succ = next((i for i, n in enumerate(rest) if n in succs), len(rest))
    earliest = max((i for i, n in enumerate(rest) if n in preds), default=-1) + 1
    at = first_succ
    covered = 0.0
    while at > earliest and covered < hide_seconds:
        prev = rest[at - 1]
        if g.nodes[prev].op in (STORE_OP, LOAD_OP):
            at -= 1
            continue
        covered += cost.node_seconds(g, prev) if cost is not None else 0.0
        at -= 1
    return rest[:at] + [nid] + rest[at:]


# ------------------------------------------------------------------ swap rule checks
def why_not_swap(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> str | None:
    users = list(dict.fromkeys(users))
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


def _why_not_tensor(g: Graph, tensor: int) -> str | None:
    meta = g.tensors[tensor]
    what = describe_tensor(g, tensor)
    if meta.role.caller_held:
        return (f"{what} is held by the caller ({meta.role.value}): parameters, buffers, optimizer "
                "state and batch tensors are never swapped (an in-place update would land on the "
                "copy and be lost)")
    if meta.storage in host_storages(g):
        return f"{what} already lives in host memory"
    prod = producer_map(g).get(tensor)
    if prod is None:
        return f"{what} has no producer"
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


def _why_not_users(g: Graph, order: Sequence[int], tensor: int, users: Sequence[int]) -> str | None:
    what = describe_tensor(g, tensor)
    if not users:
        return f"no users given to read a loaded copy of {what}"
    pos = positions(order)
    prod = producer_map(g).get(tensor)
    for u in users:
        if u not in g.nodes:
            return f"user {u} is not a node of the graph"
        if not reads_any(g.nodes[u], (tensor,)):
            return f"{describe_node(g, u)} does not read {what}"
        if is_swap_op(g.nodes[u].op):
            return f"{describe_node(g, u)} is a swap op: it keeps reading the original"
        if prod is not None and pos[u] <= pos[prod]:
            return f"{describe_node(g, u)} runs before the producer of {what} in this order"
    return None
