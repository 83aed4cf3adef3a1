"""How long derivations take, per kind and per node of the programs simulated or expanded in
full: the search reads them to leave time for what it starts (DeriveTimes, which a
Deriver is)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from peakcut.ir.tags import FissionTag
from peakcut.optimizer.state import State

EXACT_OVER_FINISH = 10.0   # a full expansion's seconds a node over `finish`'s (simulate, hash) before
# any is measured: 125 us vs 12-13 us a node (median) on GPT-2-XL and Llama-2-7B at paper size
PER_NODE_SAMPLES = 32      # recent `finish` durations a node whose median prices an expansion


@dataclass
class DeriveTimes:
    """Durations of recent derivations: by kind, and by node of the program."""

    seconds: dict[str, list[float]] = field(default_factory=dict, kw_only=True)   # kind -> durations
    node_seconds: dict[str, list[float]] = field(default_factory=dict, kw_only=True)  # "finish"/"exact" -> s a node
    full_nodes: dict[str, int] = field(default_factory=dict, kw_only=True)    # state digest -> full_expansion_nodes

    def record(self, kind: str, t0: float) -> None:
        """Note how long a step of this kind took since t0 (expected_seconds reads it)."""
        self.seconds.setdefault(kind, []).append(time.perf_counter() - t0)

    def record_per_node(self, kind: str, seconds: float) -> None:
        """Note the seconds a node of a program took in a step of this kind ("finish", "exact")."""
        self.node_seconds.setdefault(kind, []).append(seconds)

    def expected_seconds(self, kind: str) -> float:
        """The longest recent duration of a derivation of this kind (0 when never seen)."""
        return max(self.seconds.get(kind, [0.0])[-8:])

    def expected_exact_seconds(self, state: State) -> float:
        """How long `exact(state)` should take (0 for a state that is exact already): its full
        expansion's nodes (full_expansion_nodes) at the median seconds a node of the recent exact
        derivations, or, before one, EXACT_OVER_FINISH times that of recent simulations."""
        if not state.compact:
            return 0.0
        exact = self.node_seconds.get("exact")
        per_node = (_median(exact[-PER_NODE_SAMPLES:]) if exact
                    else EXACT_OVER_FINISH * _median(self.node_seconds.get("finish", [0.0])[-PER_NODE_SAMPLES:]))
        nodes = self.full_nodes.get(state.digest)
        if nodes is None:
            nodes = self.full_nodes[state.digest] = full_expansion_nodes(state)
        return nodes * per_node


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def full_expansion_nodes(state: State) -> int:
    """How many nodes `state`'s program has on the full expansion: a node of a compact program
    in part 0 of regions r1, r2, ... (its fission tag's path) is there n1 x n2 x ... times; a
    compact program's keep-alive nodes are not."""
    if not state.compact:
        return len(state.program.nodes)
    tree = state.tree
    total = 0
    for node in state.program.nodes.values():
        tag = node.tags.get(FissionTag)
        if tag is None:
            total += 1
        elif tag.role != "keep":        # (a compact expansion's keep-alive only)
            total += math.prod(tree.node(r).n for r, _ in tag.path)
    return total
