"""A new rule is one class and one registration: this test writes a program rule (a remat whose
recomputes the generated code marks, kind "marked-remat"), registers it in a Registry next to
the registered rules, and the search, derivation (replay, undo) and placement use it with no
other change; its code hook (codegen.hooks) reaches codegen the way a caller hands one in."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

import peakcut
from peakcut.codegen.hooks import CodeHook, Names, NodeCode
from peakcut.codegen.source import generate_source
from peakcut.cost import get_cost_model
from peakcut.ir.graph import Graph
from peakcut.ir.tags import RematTag
from peakcut.optimizer import Objective, optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.search import search
from peakcut.rules import RULES, Registry
from peakcut.rules.remat_rule import RematRule
from peakcut.schedule.placement import Placement
from tests.conftest import SmallCNN, cnn_loss


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

