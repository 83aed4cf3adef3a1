"""The fast paths of the search's inner loop give exactly what the straightforward code gave.

Graph queries (producers, users, in-place writers, storage owners, host storages), the call
keys and latencies of the analytic cost model (with its per-node memo), the timeline and
step simulations, placement, the computation hash and the swap rule's checks are compared
with the reference implementations in tests/perf/reference.py, bit for bit, on captured
graphs and on graphs the rules derive from them (swaps, recomputes, their undoing, fission
expansions, placed and random orders).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

import peakcut
from peakcut.cost import get_cost_model, get_profile
from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.calls import call_key
from peakcut.fission.build import find_ftree
from peakcut.fission.expand import expand
from peakcut.fission.loss import detach_loss
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tags import RematTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.memory import MemoryProfile, simulate
from peakcut.optimizer.state import computation_hash
from peakcut.rules import RULES
from peakcut.schedule import place
from peakcut.simulate import simulate_timeline
from peakcut.simulate.timeline import Timeline
from peakcut.transform import (
    deremat,
    deswap,
    why_not_deremat,
    why_not_deswap,
    why_not_swap,
)
from peakcut.transform.rewrite import check_order_matches, positions
from peakcut.workloads import get_workload
from tests.conftest import SmallCNN, cnn_loss
from tests.perf import reference as ref
from tests.simulate.helpers import (
    FakeCost,
    insert_swap,
    random_seconds,
    random_topological_order,
    swap_chain,
)

Case = tuple[str, Graph, list[int]]


def _derived(name: str, g: Graph, order: list[int], steps: int) -> list[Case]:
    """(g, order), then the rules applied at the hot-spot one after the other (swap and remat
    alternately), each placed, then the last swap and recompute undone."""
    cases: list[Case] = [(name, g, list(order))]
    cost = get_cost_model("h200")
    for step in range(steps):
        kind = ("swap", "remat")[step % 2]
        found = RULES.hotspot_candidates(g, order, limit=2, kinds=(kind,))
        if not found:
            continue
        rw = found[0].apply(g, order)
        g, order = rw.graph, rw.order
        cases.append((f"{name}+{kind}{step}", g, list(order)))
        cases.append((f"{name}+{kind}{step} placed", g, place(g, order, cost, placements=RULES.placements(g))))
    loads = [n for n in order if g.nodes[n].op == LOAD_OP and why_not_deswap(g, order, n) is None]
    if loads:
        rw = deswap(g, order, loads[-1])
        cases.append((f"{name} deswap", rw.graph, list(rw.order)))
    remats = [n for n in order if g.nodes[n].tags.get(RematTag) is not None and why_not_deremat(g, order, n) is None]
    if remats:
        rw = deremat(g, order, remats[-1])
        cases.append((f"{name} deremat", rw.graph, list(rw.order)))
    return cases


def _fissioned(name: str, g: Graph) -> list[Case]:
    """The loss-detached graph with its largest top-level F-Tree node split in 2 and 4."""
    base = detach_loss(g)
    order = list(base.order)
    tree, dgraph = find_ftree(base, order, 4, batch_only=True)
    tops = sorted((f for f in tree.nodes if f.parent is None), key=lambda f: -len(f.nodes))
    cases: list[Case] = [(f"{name} detached", base, order)]
    for f in tops[:1]:
        for n in (2, 4):
            if f.length % n == 0:
                ex = expand(base, order, tree.with_n(f.id, n), dgraph, check=False)
                cases.append((f"{name} fission {f.id}x{n}", ex.graph, list(ex.order)))
    return cases


@pytest.fixture(scope="module")
def corpus() -> list[Case]:
    torch.manual_seed(0)
    cnn = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))),
                          cnn_loss, "adamw")
    cases = _derived("cnn", cnn, cnn.order, 4)
    cases.append(("cnn random order", cnn, random_topological_order(cnn, 1)))
    for workload in ("vit-base", "bert-base", "gpt-neo-1.3b"):
        inst = get_workload(workload).build("tiny")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        cases += _derived(workload, g, g.order, 4)
        fissioned = _fissioned(workload, g)
        cases += fissioned
        cases += _derived(fissioned[-1][0], fissioned[-1][1], fissioned[-1][2], 2)
    return cases


# ------------------------------------------------------------------ graph queries
def test_node_facts(corpus: list[Case]) -> None:
    for name, g, _ in corpus:
        for nid, node in g.nodes.items():
            assert node.input_ids() == ref.input_ids(node), (name, nid)
            assert node.input_tuple == tuple(ref.input_ids(node)), (name, nid)
            assert node.output_ids() == ref.output_ids(node), (name, nid)
            assert node.output_tuple == tuple(ref.output_ids(node)), (name, nid)
            assert g.mutated_tensors(nid) == ref.mutated_tensors(g, nid), (name, nid)


def test_graph_queries(corpus: list[Case]) -> None:
    for name, g, _ in corpus:
        for h in (g, g.copy()):
            producer = ref.producer_map(g)
            users = ref.users_map(g)
            writers = ref.writers_map(g)
            owner = ref.storage_owner(g)
            assert h.producer_map() == producer, name
            assert all(h.producer(t) == producer.get(t) for t in g.tensors), name
            assert all(h.users(t) == users.get(t, []) for t in g.tensors), name
            assert h.users_of(g.tensors) == {t: users.get(t, []) for t in g.tensors}, name
            some = list(g.tensors)[::7]
            assert h.copy().users_of(some) == {t: users.get(t, []) for t in some}, name
            assert all(h.predecessors(n) == ref.predecessors(g, n, producer) for n in g.nodes), name
            assert all(h.storage_writers(s) == writers.get(s, []) for s in g.storages), name
            assert h.storage_owner() == owner, name
            assert list(h.storage_owner()) == list(owner), name
            assert all(h.storage_owner_of(s) == owner.get(s) for s in g.storages), name
            host = ref.host_storages(g)
            assert h.host_storages() == host, name
            assert all(h.is_host_storage(s) == (s in host) for s in g.storages), name


def test_caches_follow_edits(corpus: list[Case]) -> None:
    """Cached owners, writers and host storages are rebuilt after every kind of edit."""
    name, g, order = next(c for c in corpus if any(n.op == STORE_OP for n in c[1].nodes.values()))

    def same(h: Graph) -> None:
        assert h.storage_owner() == ref.storage_owner(h), name
        assert h.host_storages() == ref.host_storages(h), name
        writers = ref.writers_map(h)
        assert all(h.storage_writers(s) == writers.get(s, []) for s in h.storages), name

    def edited(h: Graph, change: Callable[[GraphEditor], None]) -> Graph:
        """h edited by `change` (the editor starts from h's warm caches)."""
        same(h)
        editor = GraphEditor(h)
        change(editor)
        return editor.finish()

    h = edited(g, lambda e: e.set_order(list(reversed(g.order))))
    assert h.storage_owner() == ref.storage_owner(h), name
    h = edited(h, lambda e: e.set_order(list(g.order)))
    same(h)
    store = next(n for n in h.nodes.values() if n.op == STORE_OP)
    (host,) = store.output_ids()
    meta = h.tensors[host]
    h = edited(h, lambda e: e.set_tensor(dataclasses.replace(
        meta, storage=h.tensors[store.input_ids()[0]].storage)))
    same(h)
    h = edited(h, lambda e: e.set_tensor(meta))
    same(h)


def test_nodes_pickle_without_their_cached_values(corpus: list[Case]) -> None:
    import copy
    import pickle

    from peakcut.optimizer import state

    name, g, order = corpus[-1]
    computation_hash(g, order)   # fills the node caches
    assert all(state._HASHED.get(n) is not None for n in g.nodes.values())
    back = pickle.loads(pickle.dumps(g))
    assert back.nodes == g.nodes and all(state._HASHED.get(n) is None for n in back.nodes.values())
    for nid, node in back.nodes.items():
        assert node.input_tuple == g.nodes[nid].input_tuple, nid
        assert node.output_tuple == g.nodes[nid].output_tuple, nid
        assert node.mutated_ids() == g.nodes[nid].mutated_ids(), nid
    assert computation_hash(back, order) == computation_hash(g, order)
    node = next(iter(g.nodes.values()))
    assert copy.copy(node) == node and copy.deepcopy(node) == node


def test_mutated_ids_of_unknown_op_raise_when_asked() -> None:
    from peakcut.ir.node import Node

    node = Node(id=1, op="nosuch.op.default", args=(), kwargs={}, outputs=(2,))
    with pytest.raises(ValueError, match="not registered"):
        node.mutated_ids()


def test_positions_and_order_checks(corpus: list[Case]) -> None:
    for name, g, order in corpus:
        assert positions(order) == ref.positions(order), name
        assert list(positions(order)) == list(ref.positions(order)), name
        assert check_order_matches(g, order) == ref.check_order_matches(g, order) is None, name
        stale = order[:-1] + [max(order) + 1]
        assert check_order_matches(g, stale) == ref.check_order_matches(g, stale), name
        assert check_order_matches(g, order[:-1]) == ref.check_order_matches(g, order[:-1]), name
    assert positions([3, 1, 3]) == ref.positions([3, 1, 3])


# ------------------------------------------------------------------ cost model
def test_call_keys(corpus: list[Case]) -> None:
    for name, g, order in corpus:
        for nid in order:
            assert call_key(g, nid) == ref.call_key(g, nid), (name, nid)


@pytest.mark.parametrize("profile", ["h200", "cpu"])
def test_analytic_latencies_with_the_node_memo(corpus: list[Case], profile: str) -> None:
    """The same sequence of questions gets the same answers, also for a node object seen
    again in a graph where its input tensors have other layouts."""
    fast = AnalyticCostModel(get_profile(profile))
    slow = ref.ReferenceAnalytic(get_profile(profile))
    for _ in range(2):
        for name, g, order in corpus:
            for nid in order:
                assert fast.node_seconds(g, nid) == slow.node_seconds(g, nid), (name, nid)
    name, g, order = corpus[-1]
    edit = GraphEditor(g)
    h = edit.graph
    for nid in order:   # same node objects, inputs re-laid out (and re-typed)
        for t in h.nodes[nid].input_ids():
            meta = h.tensors[t]
            if len(meta.shape) == 2 and meta.shape[0] > 1 and meta.shape[1] > 1:
                edit.set_tensor(dataclasses.replace(meta, stride=(1, meta.shape[0])))
            elif meta.dtype == "float32":
                edit.set_tensor(dataclasses.replace(meta, dtype="float16"))
    h = edit.finish()
    for nid in order:
        assert fast.node_seconds(h, nid) == slow.node_seconds(h, nid), (name, nid)
        assert fast.node_seconds(g, nid) == slow.node_seconds(g, nid), (name, nid)


# ------------------------------------------------------------------ simulation
def _same_timeline(a: Timeline, b: Timeline, what: str) -> None:
    for f in dataclasses.fields(Timeline):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), (what, f.name)
        else:
            assert x == y and type(x) is type(y), (what, f.name, x, y)


def _same_profile(a: MemoryProfile, b: MemoryProfile, what: str) -> None:
    for f in dataclasses.fields(MemoryProfile):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), (what, f.name)
        else:
            assert x == y and type(x) is type(y), (what, f.name)
    assert list(a.storage_lifetime) == list(b.storage_lifetime), what


class RandomCost:
    """A latency per node (copies included) drawn once: zeros and repeated values (ties in end
    times) and arbitrary floats (sums that depend on the order of the additions)."""

    def __init__(self, overlap: bool, seed: int = 0) -> None:
        self.name = f"random{seed}"
        self.overlap_copies = overlap
        self.rng = random.Random(seed)
        self.table: dict[int, float] = {}

    def node_seconds(self, g: Graph, nid: int) -> float:
        if nid not in self.table:
            self.table[nid] = self.rng.choice([0.0, 0.0, 1e-3, 2.5e-3, self.rng.random() * 1e-2])
        return self.table[nid]

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        return 3e-3


@pytest.mark.parametrize("device", ["h200", "cpu"])
def test_timelines(corpus: list[Case], device: str) -> None:
    cost = get_cost_model(device)
    slow = ref.ReferenceAnalytic(cost.profile, tf32=cost.tf32)
    for name, g, order in corpus:
        for workspace in ("cpu", "cpu-rules", None):
            new = simulate_timeline(g.copy(), order, cost, workspace)
            old = ref.simulate_timeline(g.copy(), order, slow, workspace)
            _same_timeline(new, old, f"{name} {device} {workspace}")
        for seed in range(2):
            fake = RandomCost(device == "h200", seed)
            _same_timeline(simulate_timeline(g, order, fake), ref.simulate_timeline(g, order, fake),
                           f"{name} {device} random {seed}")


def test_step_simulation(corpus: list[Case]) -> None:
    for name, g, order in corpus:
        for workspace in ("cpu", "cpu-rules", None):
            _same_profile(simulate(g.copy(), order, workspace), ref.simulate(g, order, workspace),
                          f"{name} {workspace}")


def test_simulation_errors_are_the_same() -> None:
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))),
                        cnn_loss, "sgd")
    cost = get_cost_model("h200")
    bad = list(reversed(g.order))
    with pytest.raises(GraphError, match="before"):
        simulate_timeline(g, bad, cost)
    edit = GraphEditor(g)
    edit.set_control(g.order[3], (10**9,))
    h = edit.finish()
    with pytest.raises(GraphError, match="depends on unknown node 1000000000"):
        simulate_timeline(h, h.order, cost)
    with pytest.raises(ValueError, match="unknown workspace model"):
        simulate_timeline(g, g.order, cost, "gpu")
    assert simulate_timeline(g, g.order, cost, "cpu").peak_bytes > 0


def _hand_built(seed: int) -> Graph:
    """A swapped chain (its load read by the last node, or by nobody), with control edges
    between copies and compute nodes on odd seeds."""
    g, a, exp, dot = swap_chain(between=6)
    users = [dot] if seed % 3 else []
    g, store, load = insert_swap(g, a, exp, dot, users)
    if seed % 2:
        chain = [n for n in g.order if g.nodes[n].op == "aten.sin.default"]
        edit = GraphEditor(g)
        edit.set_control(chain[2], (store,))          # compute waits for a swap-out
        edit.set_control(load, (chain[1], exp))       # a swap-in waits for compute
        g = edit.finish()
    return g


@pytest.mark.parametrize("seed", range(6))
def test_timelines_with_ties_and_copy_waits(seed: int) -> None:
    """Zero and equal latencies (ties in end times), copies waiting and waited for by control
    edges, a load nobody reads; random orders."""
    g = _hand_built(seed)
    for k, order in enumerate([g.order, *(random_topological_order(g, seed * 10 + i) for i in range(4))]):
        for overlap in (True, False):
            cost = FakeCost(random_seconds(seed * 100 + k), overlap_copies=overlap, copy=1.0)
            what = f"seed {seed} order {k} overlap {overlap}"
            _same_timeline(simulate_timeline(g, order, cost), ref.simulate_timeline(g, order, cost), what)
            assert place(g, order, cost, placements=RULES.placements(g)) == ref.place(g, order, cost), what
            _same_profile(simulate(g, order), ref.simulate(g, order), what)


# ------------------------------------------------------------------ placement
def test_placement(corpus: list[Case]) -> None:
    costs = [None, get_cost_model("h200"), get_cost_model("cpu"), RandomCost(True)]
    placed = 0
    for name, g, order in corpus:
        for cost in costs:
            new = place(g, order, cost, placements=RULES.placements(g))
            assert new == ref.place(g, order, cost), (name, getattr(cost, "name", None))
            placed += new != order
    assert placed, "some orders were changed by placement"


def test_placement_rejects_repeated_nodes(corpus: list[Case]) -> None:
    name, g, order = next(c for c in corpus if any(n.op == STORE_OP for n in c[1].nodes.values()))
    with pytest.raises(GraphError, match="twice"):
        place(g, [*order, order[0]], placements=RULES.placements(g))


# ------------------------------------------------------------------ hashing and rules
def test_computation_hash(corpus: list[Case]) -> None:
    seen = set()
    for name, g, order in corpus:
        expected = ref.computation_hash(g, order)
        assert computation_hash(g, order) == expected, name
        assert computation_hash(g, order) == expected, name          # templates memoized
        assert computation_hash(g) == ref.computation_hash(g), name
        edit = GraphEditor(g)   # new node objects: templates built again
        for n in g.nodes.values():
            edit.replace_node(dataclasses.replace(n))
        fresh = edit.finish()
        assert computation_hash(fresh, order) == expected, name
        seen.add(expected)
    assert len(seen) > len(corpus) // 2


def test_hash_of_unusual_arguments() -> None:
    """Dict arguments, braces and quotes in reprs, strings, nested lists, missing tensors."""
    from peakcut.ir.node import Node, TensorRef

    nodes = {}
    tensors = {1: TensorMeta(1, (1,), (1,), "float32", 100, 0, Role.INPUT, "x")}
    nodes[2] = Node(id=2, op="aten.add.Tensor", args=(TensorRef(1), [TensorRef(1), (2.5, None)]),
                    kwargs={"b": {"z": "{x}", "a": [TensorRef(42)]}, "a": ("'}", True)}, outputs=(3, None))
    nodes[4] = Node(id=4, op="aten.mul.Tensor", args=(TensorRef(3), torch.float32, float("nan"), "s"),
                    kwargs={"k": {}, "l": [], "m": (TensorRef(3),)}, outputs=(None, 9))
    nodes[5] = Node(id=5, op="aten.zeros.default", args=([2, 3],), outputs=(6,),
                    kwargs={"layout": "{}{", "names": ("}",), "d": {"{": 1}})
    nodes[7] = Node(id=7, op="aten.add.Tensor", args=(), outputs=(8,),   # tensors in dict order
                    kwargs={"z": TensorRef(1), "other": {"y": TensorRef(3), "b": TensorRef(9)},
                            "a": [TensorRef(3), TensorRef(1)]})
    class Slot:
        def __repr__(self) -> str:
            return "\x00\x01tensor\x01\x00"   # what stands for a tensor in the hash's text

    nodes[10] = Node(id=10, op="aten.add.Tensor", args=(TensorRef(1), Slot(), "\x00\x01tensor"),
                     kwargs={"s": [Slot(), TensorRef(3)]}, outputs=(11,))
    g = Graph(tensors=tensors, nodes=nodes, inputs=[1], input_names=["batch:{0}'\""], outputs=[3, 9],
              output_names=["loss", "out:0"], storages={100: 4}, order=[2, 4, 5, 7, 10],
              control={4: (2, 77)})
    assert computation_hash(g) == ref.computation_hash(g)
    assert computation_hash(g, [4, 2, 5, 10, 7]) == ref.computation_hash(g, [4, 2, 5, 10, 7])
    assert computation_hash(g, [5, 2, 4, 7, 10]) == ref.computation_hash(g, [5, 2, 4, 7, 10])


def test_hash_of_shared_nodes_with_other_inputs(corpus: list[Case]) -> None:
    """Node objects hashed before, now below other input names or control edges."""
    for name, g, order in corpus[::4]:
        assert computation_hash(g, order) == ref.computation_hash(g, order), name
        edit = GraphEditor(g)
        edit.set_interface(input_names=[f"{n}'" for n in g.input_names])
        h = edit.graph
        assert computation_hash(h, order) == ref.computation_hash(h, order), name
        last = order[-1]
        edit.add_control(last, [order[0]])
        assert computation_hash(h, order) == ref.computation_hash(h, order), name
        assert computation_hash(g, order) == ref.computation_hash(g, order), name


def test_swap_checks(corpus: list[Case]) -> None:
    """why_not_swap gives the same answer (and message) for every tensor and its readers."""
    checked = applicable = 0
    for name, g, order in corpus[::4]:
        pos = positions(order)
        for t, meta in list(g.tensors.items())[::5]:
            if meta.role is not Role.ACTIVATION:
                continue
            readers = g.users(t)
            for users in (readers, readers[-1:], [u for u in readers if pos[u] > pos.get(g.producer(t), -1)][1:]):
                got = why_not_swap(g, order, t, users)
                assert got == ref.why_not_swap(g, order, t, users), (name, t, users)
                checked += 1
                applicable += got is None
    assert checked > 300 and applicable > 10, (checked, applicable)


# ------------------------------------------------------------------ paper size
@pytest.mark.slow
def test_paper_size_vit() -> None:
    """The ViT-base paper graph and two derived ones: timeline, hash, placement, queries."""
    inst = get_workload("vit-base").build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    cost = get_cost_model("h200")
    slow = ref.ReferenceAnalytic(cost.profile, tf32=cost.tf32)
    for name, h, order in _derived("vit-base paper", g, g.order, 2):
        _same_timeline(simulate_timeline(h, order, cost), ref.simulate_timeline(h, order, slow),
                       name)
        assert computation_hash(h, order) == ref.computation_hash(h, order), name
        assert place(h, order, cost, placements=RULES.placements(h)) == ref.place(h, order, cost), name
        assert h.storage_owner() == ref.storage_owner(h), name
        writers = ref.writers_map(h)
        assert all(h.storage_writers(s) == writers.get(s, []) for s in h.storages), name
