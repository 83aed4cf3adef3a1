"""A new rule is one class and one registration.

A program rule: this test writes one (a remat whose recomputes the generated code marks, kind
"marked-remat"), registers it in a Registry next to the registered rules, and the search,
derivation (replay, undo) and placement use it with no other change; its code hook
(codegen.hooks) reaches codegen the way a caller hands one in.

A rewrite rule in a phase of its own, with a tag kind of its own (tests/rules/new_phase_rule.py):
registered the same way, the optimizer runs its phase after the search (optimizer.polish runs
every phase after the search that a registered rule declares), and its tag goes through the
graph JSON."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

import torch
from torch import nn

import peakcut
from peakcut.codegen.hooks import CodeHook, Names, NodeCode
from peakcut.codegen.source import generate_source
from peakcut.cost import get_cost_model
from peakcut.ir.graph import Graph
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.ir.tags import RematTag, tags_to_json
from peakcut.optimizer import Objective, optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.polish import polished
from peakcut.optimizer.search import search
from peakcut.rules import RULES, Registry
from peakcut.rules.remat_rule import RematRule
from peakcut.schedule.placement import Placement
from tests.conftest import SmallCNN, cnn_loss
from tests.rules.new_phase_rule import SETTLE, SettleActivationsRule, SettledTag


class MarkedRemat(RematRule):
    """Remat under another kind; its code hook (MarkedCode) writes a `# marked` line before a
    recompute."""

    kind = "marked-remat"


class MarkedCode(CodeHook):
    """The new rule's code hook: codegen imports no rule, the caller hands it in."""

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        return _Marks(g) if any(n.tags.get(RematTag) is not None for n in g.nodes.values()) else None


class _Marks(NodeCode):
    def __init__(self, g: Graph) -> None:
        self.g = g

    def prologue(self) -> list[str]:
        return ["    # this step has marked recomputes"]

    def before(self, nid: int, pad: str) -> list[str]:
        return [f"{pad}# marked"] if self.g.nodes[nid].tags.get(RematTag) is not None else []


WITH_MARKED = Registry(regions=RULES.regions, programs=(*RULES.programs, MarkedRemat()),
                       rewrites=RULES.rewrites)
WITH_SETTLE = Registry(regions=RULES.regions, programs=RULES.programs, rewrites=(*RULES.rewrites, SettleActivationsRule()))


def _root() -> tuple[Graph, peakcut.optimizer.state.State]:
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "sgd")
    return g, optimize_graph(g, time_budget=0, device="rtx3090").result.root


def test_a_registered_rule_takes_part_in_moves_derivation_placement_and_codegen() -> None:
    _, root = _root()
    deriver = Deriver(get_cost_model("rtx3090"), rules=WITH_MARKED)
    assert WITH_MARKED.move_kinds == (*RULES.move_kinds[:-1], "marked-remat", "taso")
    moves = list(children(root, deriver, MoveSettings.only("marked-remat"), random.Random(0)))
    assert moves and {m.kind for m in moves} == {"marked-remat"}
    state = moves[0].build()
    assert [r.kind for r in state.recipes] == ["marked-remat"]
    recompute = next(n for n in state.program.nodes.values() if n.tags.get(RematTag) is not None)
    assert WITH_MARKED.placements(state.program) == {recompute.id: Placement.LATE}
    source = generate_source(state.program, state.order, extra=(MarkedCode(),))
    assert "# this step has marked recomputes" in source
    assert source.count("# marked\n") == 1 and source.count("# recompute of") == 1
    undo = next(m for m in children(state, deriver, MoveSettings.only(), random.Random(0)))
    assert undo.kind == "undo" and undo.build().recipes == ()
    again = deriver.replay(root.program, root.order, state.recipes, frozenset())
    assert again[2] == state.recipes


def test_a_search_on_a_registry_with_the_new_rule_builds_its_children() -> None:
    _, root = _root()
    deriver = Deriver(get_cost_model("rtx3090"), rules=WITH_MARKED)
    result = search(root, deriver, Objective("memory", 0), time_budget=60, max_states=30,
                    settings=MoveSettings.only("marked-remat"))
    assert result.states > 1 and result.failed == 0
    # what it built, by kind: the new rule's children, and undos where a state held two recipes
    # (undoing a lone recipe gives the root again, a duplicate never built). How deep 30 states
    # go depends on the machine's convolution scratch: under AVX2 at one thread the hot-spot
    # offers two sites, the queue empties after 3 states, and no undo is built.
    assert {"moves", "marked-remat"} <= set(deriver.seconds) <= {"moves", "marked-remat", "undo"}


def _conv_stack() -> peakcut.optimizer.state.State:
    """The root of three conv-bn-relu layers' step, whose plan peaks in the backward."""
    torch.manual_seed(0)
    layers = [m for c in (3, 8, 8) for m in (nn.Conv2d(c, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 16 * 16, 5))
    g = peakcut.capture(model, (torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))), cnn_loss, "sgd")
    return optimize_graph(g, time_budget=0, device="rtx3090").result.root


def test_a_rule_in_a_new_phase_runs_there_and_its_tag_goes_through_json() -> None:
    root = _conv_stack()
    objective = Objective("latency", math.inf)       # the lower peak is better
    assert SETTLE not in {p for r in RULES.rewrites for p in r.phases}
    deriver = Deriver(get_cost_model("rtx3090"), rules=WITH_SETTLE)
    result = search(root, deriver, objective, time_budget=60, max_states=1)
    assert not any(m.rule == SettleActivationsRule.kind for m in children(root, deriver, MoveSettings(),
                                                                            random.Random(0)))
    done = polished(result, deriver, objective, deadline=time.perf_counter() + 60)
    best = done.best
    settled = [n for n in best.program.nodes.values() if n.tags.get(SettledTag) is not None]
    assert settled and best.applied[-1].startswith("settle: ") and best.peak_bytes < result.best.peak_bytes
    assert "settled" in tags_to_json(settled[0].tags)
    again = graph_from_json(graph_to_json(best.program))
    assert {n.id: n.tags for n in again.nodes.values()} == {n.id: n.tags for n in best.program.nodes.values()}
