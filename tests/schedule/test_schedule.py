"""Re-ordering: exact memory of orders, DP optimality on small windows, bounds, partitions, full schedules."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import peakcut
from peakcut.memory import simulate
from peakcut.runtime.equivalence import check_equivalence
from peakcut.schedule import Problem, Reachability, lower_bound, schedule
from peakcut.schedule.dp import dp_window, window_context, window_peak
from peakcut.schedule.greedy import greedy_order
from peakcut.schedule.partition import segments
from peakcut.workloads.nasnet import random_nasnet
from tests.conftest import cnn_loss


def random_topological(problem: Problem, seed: int) -> list[int]:
    """Kahn's algorithm with random tie-breaking."""
    rng = random.Random(seed)
    waiting = [len(p) for p in problem.preds]
    ready = [v for v in range(problem.n) if not waiting[v]]
    order = []
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        order.append(v)
        for s in problem.succs[v]:
            waiting[s] -= 1
            if not waiting[s]:
                ready.append(s)
    return order


@pytest.fixture(scope="module")
def cnn_graph():
    from tests.conftest import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN()
    batch = (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))
    return peakcut.capture(model, batch, cnn_loss, "adamw")


@pytest.fixture(scope="module")
def nasnet_graph():
    model, x = random_nasnet(3, cells=5)
    return peakcut.capture(model, x)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_problem_memory_equals_the_spine_on_random_orders(cnn_graph, seed):
    problem = Problem(cnn_graph)
    order = random_topological(problem, seed)
    curve = problem.curve(order)
    spine = simulate(cnn_graph, problem.node_ids(order))
    assert curve.peak_bytes == spine.peak_bytes
    assert np.array_equal(curve.timeline, spine.timeline)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_lower_bound_holds_for_every_order(nasnet_graph, seed):
    problem = Problem(nasnet_graph)
    assert lower_bound(problem) <= problem.peak(random_topological(problem, seed))


def _brute_force_window(problem, order, lo, hi):
    first, last = problem.intervals(order)
    ctx = window_context(problem, order, lo, hi, first, last)
    local = list(range(len(ctx.nodes)))
    best = None
    for perm in itertools.permutations(local):
        done = 0
        ok = True
        for j in perm:
            if ctx.preds[j] & ~done:
                ok = False
                break
            done |= 1 << j
        if ok:
            peak = window_peak(ctx, perm)
            best = peak if best is None else min(best, peak)
    return ctx, best


@pytest.mark.parametrize("start", [10, 25, 40, 60])
def test_dp_finds_the_optimal_window_order(nasnet_graph, start):
    problem = Problem(nasnet_graph)
    order = random_topological(problem, start)
    ctx, brute = _brute_force_window(problem, order, start, start + 7)
    result = dp_window(ctx, bound=10**15)
    assert result is not None and result.exact
    assert result.peak_bytes == brute
    # the DP's order really has that peak when spliced into the whole order
    spliced = order[:start] + result.order + order[start + 7:]
    assert problem.is_topological(spliced)
    assert problem.curve(spliced).timeline[start:start + 7].max() == brute


def test_dp_returns_none_when_the_bound_is_too_low(nasnet_graph):
    problem = Problem(nasnet_graph)
    order = problem.eager_order()
    first, last = problem.intervals(order)
    ctx = window_context(problem, order, 5, 12, first, last)
    assert dp_window(ctx, bound=ctx.base_bytes - 1) is None


def test_greedy_and_partition_orders_are_topological(cnn_graph, nasnet_graph):
    for g in (cnn_graph, nasnet_graph):
        problem = Problem(g)
        assert problem.is_topological(greedy_order(problem))
        parts = segments(problem, list(range(problem.n)))
        segment_of = {v: i for i, part in enumerate(parts) for v in part}
        assert sorted(segment_of) == list(range(problem.n))
        for v in range(problem.n):
            assert all(segment_of[p] <= segment_of[v] for p in problem.preds[v])


def test_narrow_waist_matches_its_definition(nasnet_graph):
    problem = Problem(nasnet_graph)
    reach = Reachability(problem)
    nw = reach.narrow_waist()
    import rustworkx as rx

    dag = rx.PyDiGraph()
    dag.add_nodes_from(range(problem.n))
    for v in range(problem.n):
        for p in problem.preds[v]:
            dag.add_edge(p, v, None)
    for v in range(0, problem.n, 7):
        expected = problem.n - len(rx.ancestors(dag, v)) - len(rx.descendants(dag, v)) - 1
        assert nw[v] == expected


def test_full_schedule_is_valid_never_worse_and_exact(cnn_graph, nasnet_graph):
    for g in (cnn_graph, nasnet_graph):
        s = schedule(g, time_limit=10)
        assert sorted(s.order) == sorted(g.nodes)
        assert Problem(g).is_topological(Problem(g).indices(s.order))
        assert s.lower_bound_bytes <= s.peak_bytes <= s.eager_peak_bytes
        assert simulate(g, s.order).peak_bytes == s.peak_bytes


def test_rescheduled_program_gives_the_same_numbers(small_cnn):
    model, batch = small_cnn
    spec = peakcut.AdamW(lr=1e-2, weight_decay=0.1)

    def build(m):
        g = peakcut.capture(m, batch, cnn_loss, spec, keep_grads=True)
        s = schedule(g, time_limit=5)
        assert s.order != g.order or s.peak_bytes == s.eager_peak_bytes
        return peakcut.Step(g, s.order)

    report = check_equivalence(model, batch, cnn_loss, spec, build, steps=2, rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)


def test_incremental_after_a_local_change_is_valid_and_matches_full(nasnet_graph):
    from peakcut.schedule import incremental_schedule
    from peakcut.schedule.interval import IntervalSettings, IntervalStats, schedule_interval
    from peakcut.transform import why_not_remat

    g = nasnet_graph
    problem = Problem(g)
    settings = IntervalSettings()
    order = problem.node_ids(schedule_interval(problem, problem.eager_order(), 0, problem.n, settings,
                                               IntervalStats()))
    nw = {problem.ids[v]: x for v, x in Reachability(problem).narrow_waist().items()}
    pos = {nid: i for i, nid in enumerate(order)}
    done = 0
    for nid in order:
        outs = g.nodes[nid].output_ids()
        readers = sorted(set(g.users(outs[0])), key=pos.__getitem__) if outs else []
        if len(readers) < 2 or why_not_remat(g, order, nid, readers[1:]) is not None:
            continue
        from peakcut.transform import remat

        rw = remat(g, order, nid, readers[1:])
        new = rw.graph.with_order(rw.order)
        result = incremental_schedule(order, nw, new, set(rw.changed) | {nid}, rw.added)
        assert sorted(result.order) == sorted(new.nodes)
        assert Problem(new).is_topological(Problem(new).indices(result.order))
        assert simulate(new, result.order).peak_bytes == result.peak_bytes
        full_problem = Problem(new)
        full = full_problem.peak(schedule_interval(full_problem, full_problem.eager_order(), 0,
                                                   full_problem.n, settings, IntervalStats()))
        assert result.peak_bytes <= full
        done += 1
        if done == 3:
            break
    assert done == 3


def test_reschedule_interval_uses_narrow_waist_boundaries():
    from peakcut.schedule.incremental import IntervalRule, reschedule_interval

    order = list(range(100))
    nw = dict.fromkeys(order, 50)
    nw[30] = 2   # a good boundary on the left, within reach
    nw[75] = 8   # only an acceptable one on the right
    assert reschedule_interval(order, nw, [50, 55], IntervalRule()) == (30, 76)
    nw[75] = 50  # nothing acceptable on the right: full scheduling
    assert reschedule_interval(order, nw, [50, 55], IntervalRule()) is None
