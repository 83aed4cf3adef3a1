"""ROC's memory manager (peakcut.roc.plan_cache): optimal against a brute force, plans that
replay within the capacity, the in-place accumulator of a vertex-range part, refusals."""

from __future__ import annotations

import itertools
from functools import cache

import pytest
import torch

import peakcut
from bench.roc_memory import ChainSkip, Diamond, floor_bytes, gcn_part, order_peak
from peakcut.ir.graph import Graph
from peakcut.roc.memory_manager import CachePlan, CapacityError, plan_cache
from peakcut.transform.swap import swap


@cache
def _graph(name: str) -> Graph:
    torch.manual_seed(0)
    if name == "gcn":
        return gcn_part()
    model = ChainSkip(8, 32) if name == "chain" else Diamond(8, 32)
    return peakcut.capture(model, (torch.randn(16, 8),))


def _brute_force(g: Graph, capacity: int) -> int:
    """The least bytes moved, by trying every ready node and every set of cached storages to
    evict before it (no shortcut for views, no minimal evictions): the DP's reference."""
    held = {g.tensors[t].storage for t in g.inputs}
    outs = {g.tensors[t].storage for t in g.outputs}
    ids = list(g.order)
    touch = [{g.tensors[t].storage for t in (*g.nodes[n].input_tuple, *g.nodes[n].output_tuple)} - held
             for n in ids]
    made: list[set[int]] = []
    seen: set[int] = set()
    for t in touch:
        made.append(t - seen)
        seen |= t
    writes = [made[i] | {g.tensors[t].storage for t in g.nodes[n].mutated_ids()} for i, n in enumerate(ids)]
    preds = [{ids.index(p) for p in g.predecessors(n)} for n in ids]
    base = sum(g.storages[s] for s in held)

    @cache
    def best(done: frozenset[int], cached: frozenset[int], dirty: frozenset[int]) -> float:
        if len(done) == len(ids):
            return 0
        pinned = {s for i in done for s in made[i]} & outs
        out = float("inf")
        for v in (i for i in range(len(ids)) if i not in done and preds[i] <= done):
            now = (touch[v] - outs) | (cached - outs)
            loads = (touch[v] - outs) - cached - made[v]
            spare = sorted(cached - touch[v])
            for r in range(len(spare) + 1):
                for evict in map(set, itertools.combinations(spare, r)):
                    resident = (now - evict) | pinned | (made[v] & outs)
                    if base + sum(g.storages[s] for s in resident) > capacity:
                        continue
                    after = done | {v}
                    needed = {s for i in range(len(ids)) if i not in after for s in touch[i]}
                    kept = frozenset((now - evict) & needed - outs)
                    cost = sum(g.storages[s] for s in loads) + sum(g.storages[s] for s in evict & dirty)
                    out = min(out, cost + best(frozenset(after), kept, frozenset(((dirty - evict) | writes[v]) & kept)))
        return out

    return int(best(frozenset(), frozenset(), frozenset()))


def _check_replays(g: Graph, plan: CachePlan) -> None:
    """The plan runs every node once, each with what it touches on the device, within the capacity."""
    assert sorted(plan.order) == sorted(g.order)
    assert plan.peak_bytes <= plan.capacity
    assert all(s.device_bytes <= plan.capacity for s in plan.steps)
    assert plan.moved_bytes == plan.loaded_bytes + plan.written_back_bytes
    assert plan.loaded_bytes == sum(g.storages[s] for step in plan.steps for s in step.loads)
    assert plan.written_back_bytes == sum(g.storages[s] for step in plan.steps for s in step.write_backs)
    held = {g.tensors[t].storage for t in g.inputs} | {g.tensors[t].storage for t in g.outputs}
    on_device: set[int] = set()
    for step in plan.steps:
        node = g.nodes[step.node]
        on_device = (on_device - set(step.evicted)) | set(step.loads)
        touched = {g.tensors[t].storage for t in node.input_tuple} - held
        made = {g.tensors[t].storage for t in node.output_tuple}
        assert touched - made <= on_device | made, f"{node.name} runs without its inputs on the device"
        on_device = set(step.cached)


@pytest.mark.parametrize("name", ["chain", "diamond"])
def test_optimal_against_brute_force(name: str) -> None:
    g = _graph(name)
    floor, peak = floor_bytes(g), order_peak(g)
    for capacity in (floor, (floor + peak) // 2):
        plan = plan_cache(g, capacity)
        _check_replays(g, plan)
        assert plan.moved_bytes == _brute_force(g, capacity)
    assert plan_cache(g, peak).moved_bytes == 0      # the capture order fits: nothing moves


def test_inplace_accumulator_is_written_back() -> None:
    """In a GCN part split into vertex ranges the parts add into one storage in place: at the
    capacity of the plan below, the DP writes the partial sum back and loads it again."""
    g = _graph("gcn")
    capacity = floor_bytes(g) + 16 * 1024
    plan = plan_cache(g, capacity)
    _check_replays(g, plan)
    assert plan.moved_bytes == 32 * 1024 and plan.written_back_bytes == 16 * 1024
    (back,) = [s for s in plan.steps if s.write_backs]
    assert g.storages[back.write_backs[0]] == 16 * 1024


def test_refusals() -> None:
    g = _graph("chain")
    with pytest.raises(CapacityError, match="capacity="):
        plan_cache(g, floor_bytes(g) - 1)
    with pytest.raises(ValueError, match="capacity="):
        plan_cache(g, -1)
    with pytest.raises(ValueError, match="ops besides views"):
        plan_cache(g, order_peak(g), max_ops=3)
    a = next(n for n in g.nodes.values() if n.op == "aten.mm.default").output_tuple[0]
    swapped = swap(g, list(g.order), a, g.users(a)[-1:]).graph
    with pytest.raises(ValueError, match="peakcut.store.*host memory"):
        plan_cache(swapped, order_peak(g))
