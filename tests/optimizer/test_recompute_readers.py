"""A program rule whose readers include a recompute (Recipe.copies_of): a ReLU output that a
recomputed convolution reads in the backward is swapped for that recompute too. The recipe
names the recomputed node, not the copy's id; it survives a replay from the base, is dropped
with a reason when the recompute goes, and the program keeps eager's numbers (SGD, float64)."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP
from peakcut.ir.tags import RematTag
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import _recipe
from peakcut.optimizer.derive import Deriver, region_nodes
from peakcut.optimizer.state import State
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.workloads import get_workload
from tests.helpers import in_float64

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9)


@pytest.fixture(scope="module")
def case():
    inst = in_float64(get_workload("unet").build("tiny"))
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True)
    root = optimize_graph(g, time_budget=0, device="rtx3090").result.root
    return inst, root, Deriver(get_cost_model("rtx3090"))


def _later_readers(g: Graph, order: list[int], tensor: int, after: int) -> tuple[int, ...]:
    pos = {v: i for i, v in enumerate(order)}
    return tuple(sorted((u for u in g.users(tensor) if pos[u] > pos[after]), key=pos.__getitem__))


def _site(g: Graph, tensor: int, users: tuple[int, ...]) -> HotspotSite:
    producer = g.producer(tensor)
    assert producer is not None
    return HotspotSite(tensor, producer, users, g.storages[g.tensors[tensor].storage], 0)


def _remat_then_swap(root: State, deriver: Deriver):
    """A forward convolution recomputed for its backward readers, then its input swapped for
    every later reader, the recompute among them."""
    g, order = root.program, root.order
    regions = region_nodes(root.tree)
    remat_rule, swap_rule = RULES.program_rule("remat"), RULES.program_rule("swap")
    for conv in order:
        node = g.nodes[conv]
        if node.op != "aten.convolution.default" or g.producer(node.input_ids()[0]) is None:
            continue
        (out,) = [t for t in node.output_ids() if t is not None]
        readers = _later_readers(g, order, out, conv)[1:]    # the forward's next op keeps it
        site = _site(g, out, readers)
        if not readers or remat_rule.why_not(g, order, site) is not None:
            continue
        remat = _recipe(remat_rule, site, Query(g, order), root.base, regions)
        recomputed = deriver.with_recipe(root, remat)
        copy = next(v for v, n in recomputed.program.nodes.items()
                    if n.tags.get(RematTag) is not None and n.tags.get(RematTag).of == conv)
        x = node.input_ids()[0]
        users = _later_readers(recomputed.program, recomputed.order, x, conv)
        swap_site = _site(recomputed.program, x, users)
        if copy not in users or swap_rule.why_not(recomputed.program, recomputed.order, swap_site) is not None:
            continue
        swap = _recipe(swap_rule, swap_site, Query(recomputed.program, recomputed.order), root.base, regions)
        return conv, copy, remat, swap, recomputed, deriver.with_recipe(recomputed, swap)
    raise AssertionError("no convolution whose recompute reads a swappable input")


def test_a_swap_reaches_the_recompute_that_reads_its_tensor(case) -> None:
    inst, root, deriver = case
    conv, copy, _remat, swap, _recomputed, swapped = _remat_then_swap(root, deriver)
    assert swap is not None and swap.copies_of == (conv,) and copy not in swap.users
    g = swapped.program
    x = root.program.nodes[conv].input_ids()[0]
    read = g.nodes[copy].input_ids()[0]
    assert read != x and g.nodes[g.producer(read)].op == LOAD_OP
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, SPEC,
                                       lambda _m: Step(swapped.program, swapped.order), steps=2,
                                       rtol=1e-7, atol=1e-9)
    assert report.ok, report


def test_the_recipe_survives_a_replay_and_goes_with_its_recompute(case) -> None:
    _inst, root, deriver = case
    _conv, _copy, remat, swap, _recomputed, swapped = _remat_then_swap(root, deriver)
    replayed = deriver.with_tree(swapped, swapped.tree, "replayed from the base")
    assert replayed.recipes == (remat, swap)
    assert replayed.peak_bytes == swapped.peak_bytes
    without = deriver.without_recipes(swapped, (remat,))
    assert without.recipes == ()
    assert any("a recompute it names is gone" in line for line in without.applied)


def test_no_recipe_names_fewer_copies_than_its_site(case) -> None:
    """A node recomputed twice (for two sets of readers): a site that reads one copy has no
    recipe, since the recipe would reach the other copy too; a site reading both has one."""
    _inst, root, deriver = case
    g, order = root.program, root.order
    regions = region_nodes(root.tree)
    remat_rule, swap_rule = RULES.program_rule("remat"), RULES.program_rule("swap")
    for nid in order:
        node = g.nodes[nid]
        if not node.input_ids() or g.producer(node.input_ids()[0]) is None or len(node.output_ids()) != 1:
            continue
        (out,) = node.output_ids()
        readers = _later_readers(g, order, out, nid)[1:]
        halves = (_site(g, out, readers[:1]), _site(g, out, readers[1:]))
        if len(readers) < 2 or any(remat_rule.why_not(g, order, h) is not None for h in halves):
            continue
        twice = deriver.with_recipe(root, _recipe(remat_rule, halves[0], Query(g, order), root.base, regions))
        twice = deriver.with_recipe(twice, _recipe(remat_rule, halves[1], Query(g, order), root.base, regions))
        copies = [v for v, n in twice.program.nodes.items() if n.tags.get(RematTag) is not None and n.tags.get(RematTag).of == nid]
        x = node.input_ids()[0]
        users = _later_readers(twice.program, twice.order, x, nid)
        if len(copies) != 2 or not set(copies) <= set(users) or \
                swap_rule.why_not(twice.program, twice.order, _site(twice.program, x, users)) is not None:
            continue
        one = tuple(u for u in users if u != copies[0])
        assert _recipe(swap_rule, _site(twice.program, x, one), Query(twice.program, twice.order), root.base, regions) is None
        both = _recipe(swap_rule, _site(twice.program, x, users), Query(twice.program, twice.order), root.base, regions)
        assert both is not None and both.copies_of == (nid,)
        return
    raise AssertionError("no node recomputed twice whose input a swap can take")
