"""The rule registry: what RULES lists, the checks a Registry makes, and the loops over it that
placement uses (where the program rules' nodes go)."""

from __future__ import annotations

import random

import pytest
import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tags import RematTag
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import Deriver
from peakcut.rules import RULES, Registry
from peakcut.rules.fission_rule import FissionRule
from peakcut.rules.remat_rule import RematRule
from peakcut.rules.swap_rule import SwapRule
from peakcut.schedule.placement import Placement
from tests.conftest import SmallCNN, cnn_loss


def _graph() -> peakcut.Graph:
    torch.manual_seed(0)
    return peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "sgd")


def _with_swap_and_remat() -> tuple[peakcut.Graph, list[int]]:
    g = _graph()
    (s,) = RULES.hotspot_candidates(g, g.order, limit=1, kinds=("swap",))
    rw = s.apply(g, g.order)
    (r,) = RULES.hotspot_candidates(rw.graph, rw.order, limit=1, kinds=("remat",))
    rw = r.apply(rw.graph, rw.order)
    return rw.graph, rw.order


def test_rules_lists_every_rule_once_in_the_search_order() -> None:
    # the first rules, in their order; rules registered later come after them (a new rule
    # needs no edit here)
    assert [r.kind for r in RULES.regions][:1] == ["fission"]
    assert RULES.program_kinds[:2] == ("swap", "remat")
    # split_conv_cat first (a copy never made, at almost no latency; also tried on the root);
    # the generated substitutions that shrink the graph (one of their sites per state); then
    # checkpoint_blocks, recompute_activations, recompute_attention, checkpoint_segments (once a block is
    # checkpointed) and the inverse of checkpoint_blocks: one to three sites per base, each
    # a large step, tried at every expanded state (the search tries the first taso_per_state sites
    # of the interleaved list); split_rows and split_batch_norms last (they save transients and
    # scratch only, and cost latency); split_vertex_ranges right after generated: only GNN
    # steps have its sites, and there each expanded state tries it
    assert RULES.rewrite_kinds[:15] == ("split_conv_cat", "generated", "split_vertex_ranges", "checkpoint_blocks",
                                        "recompute_activations",
                                        "recompute_attention", "checkpoint_segments",
                                        "uncheckpoint_blocks",
                                        "merge_matmuls",
                                        "split_matmul", "drop_identity", "cancel_transposes", "fold_views",
                                        "split_rows", "split_batch_norms")
    assert RULES.move_kinds == (*(r.kind for r in RULES.regions), *RULES.program_kinds, "taso")
    assert RULES.program_rule("remat").kind == "remat"
    assert RULES.rewrite_rule("fold_views").kind == "fold_views"
    with pytest.raises(KeyError, match="known"):
        RULES.program_rule("no-such-rule")
    with pytest.raises(KeyError, match="known"):
        RULES.rewrite_rule("remat")


def test_a_registry_refuses_a_kind_twice_and_the_search_s_own_kinds() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        Registry(regions=(), programs=(SwapRule(), SwapRule()), rewrites=())
    with pytest.raises(ValueError, match="registered twice"):
        Registry(regions=(FissionRule(),), programs=(), rewrites=RULES.rewrites + RULES.rewrites[:1])

    class Undo(RematRule):
        kind = "undo"

    with pytest.raises(ValueError, match="the search's own move kinds"):
        Registry(regions=(), programs=(Undo(),), rewrites=())
    empty = Registry(regions=(), programs=(), rewrites=())
    assert empty.move_kinds == ()


def test_placements_come_from_the_program_rules() -> None:
    g, _ = _with_swap_and_remat()
    where = RULES.placements(g)
    expected = {}
    for nid, node in g.nodes.items():
        if node.op == STORE_OP:
            expected[nid] = Placement.EARLY
        elif node.op == LOAD_OP:
            expected[nid] = Placement.HIDDEN
        elif node.tags.get(RematTag) is not None:
            expected[nid] = Placement.LATE
    assert where == expected and set(where.values()) == set(Placement)
    assert RULES.placements(_graph()) == {}


def test_move_settings_name_move_kinds_of_the_registry() -> None:
    assert MoveSettings.only("swap").uses("swap") and not MoveSettings.only("swap").uses("remat")
    assert MoveSettings().uses("anything")
    MoveSettings(kinds=frozenset(RULES.move_kinds)).check(RULES)
    with pytest.raises(ValueError, match="not move kinds"):
        MoveSettings.only("offload").check(RULES)
    g = _graph()
    with pytest.raises(ValueError, match="not move kinds"):
        optimize_graph(g, time_budget=1, max_states=2, device="rtx3090", settings=MoveSettings.only("remap"))


def test_children_follow_the_registry_order_and_settings() -> None:
    g = _graph()
    root = optimize_graph(g, time_budget=0, device="rtx3090").result.root
    deriver = Deriver(get_cost_model("rtx3090"))
    kinds = [m.kind for m in children(root, deriver, MoveSettings(), random.Random(0))]
    assert kinds == sorted(kinds, key=(*RULES.move_kinds, "undo").index)
    assert {"swap", "remat"} <= set(kinds)
    only = [m.kind for m in children(root, deriver, MoveSettings.only("remat"), random.Random(0))]
    assert only and set(only) == {"remat"}
