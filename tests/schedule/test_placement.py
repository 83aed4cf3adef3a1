"""Placement of stores, loads and recomputes: store early, load just early enough, recompute late."""

from __future__ import annotations

import torch

import peakcut
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.rules import RULES
from peakcut.schedule import place
from peakcut.simulate import simulate_timeline
from tests.conftest import SmallCNN, cnn_loss


class _Cost:
    """Every compute op takes 1 ms; a copy takes `copy` seconds."""

    name = "test"

    def __init__(self, overlap: bool, copy: float) -> None:
        self.overlap_copies = overlap
        self.copy = copy

    def node_seconds(self, g, nid):
        return self.copy if g.nodes[nid].op in (STORE_OP, LOAD_OP) else 1e-3

    def copy_seconds(self, nbytes, direction):
        return self.copy


def _swapped():
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "sgd")
    cands = [c for c in RULES.hotspot_candidates(g, g.order) if c.kind == "swap"]
    assert cands, "the small CNN has a swap candidate at its peak"
    rw = cands[0].apply(g, g.order)
    return rw.graph, rw.order


def test_store_right_after_producer_and_load_hidden_when_copies_overlap():
    g, order = _swapped()
    cost = _Cost(overlap=True, copy=3.5e-3)
    placed = place(g, order, cost, placements=RULES.placements(g))
    assert sorted(placed) == sorted(order)
    store = next(n for n in placed if g.nodes[n].op == STORE_OP)
    load = next(n for n in placed if g.nodes[n].op == LOAD_OP)
    (producer,) = g.predecessors(store)
    assert placed.index(store) == placed.index(producer) + 1
    users = [n for n in placed if set(g.nodes[load].output_ids()) & set(g.nodes[n].input_ids())]
    between = placed[placed.index(load) + 1:placed.index(users[0])]
    assert len([n for n in between if g.nodes[n].op not in (STORE_OP, LOAD_OP)]) >= 4  # 4 ms >= 3.5 ms
    naive = simulate_timeline(g, order, cost)
    hidden = simulate_timeline(g, placed, cost)
    assert hidden.exposed_copy_seconds < naive.exposed_copy_seconds
    assert hidden.latency_seconds <= naive.latency_seconds


def test_load_runs_right_before_its_user_when_copies_do_not_overlap():
    g, order = _swapped()
    placed = place(g, order, _Cost(overlap=False, copy=3.5e-3), placements=RULES.placements(g))
    load = next(n for n in placed if g.nodes[n].op == LOAD_OP)
    nxt = placed[placed.index(load) + 1]
    assert set(g.nodes[load].output_ids()) & set(g.nodes[nxt].input_ids())


class _SizedCost(_Cost):
    """Like _Cost, but the loads named in `seconds` take their own time."""

    def __init__(self, seconds: dict[int, float]) -> None:
        super().__init__(overlap=True, copy=1e-4)
        self.seconds = seconds

    def node_seconds(self, g, nid):
        return self.seconds.get(nid, super().node_seconds(g, nid))


def test_loads_sharing_the_stream_are_placed_as_a_queue():
    """A long load hidden far ahead of a late reader would be issued before a short one whose
    reader comes first, and the short one would wait behind it on the copy stream: placed as
    a queue, the short one is issued first and done before the long one starts."""
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "sgd")
    order = g.order
    for _ in range(2):
        done = {g.nodes[n].input_ids()[0] for n in g.order if g.nodes[n].op == STORE_OP}
        cand = next(c for c in RULES.hotspot_candidates(g, order, limit=8, kinds=["swap"]) if c.tensor not in done)
        rw = cand.apply(g, order)
        g, order = rw.graph, rw.order
    loads = [n for n in order if g.nodes[n].op == LOAD_OP]
    assert len(loads) == 2

    def first_reader(order, load):
        outs = set(g.nodes[load].output_ids())
        return next(i for i, n in enumerate(order) if outs & set(g.nodes[n].input_ids()))

    early, late = sorted(loads, key=lambda n: first_reader(order, n))
    assert first_reader(order, early) < first_reader(order, late)
    cost = _SizedCost({late: 10e-3})     # hidden behind the ten compute nodes before its reader
    placed = place(g, order, cost, placements=RULES.placements(g))
    assert placed.index(early) < placed.index(late)
    timeline = simulate_timeline(g, placed, cost)
    i_early, i_late = timeline.order.index(early), timeline.order.index(late)
    assert timeline.end[i_early] <= timeline.start[i_late]
    reader = timeline.order.index(placed[first_reader(placed, early)])
    assert timeline.end[i_early] <= timeline.start[reader]
