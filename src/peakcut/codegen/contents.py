"""The table of contents at the top of a generated program: its inputs, its phases, its fission
regions, and what transformations applied, as the graph's node tags show them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from peakcut.codegen.fission import Item, Loop, LoopPlan, Unrolled
from peakcut.codegen.step_inputs import input_slot
from peakcut.ir.graph import Graph
from peakcut.ir.ops import STORE_OP
from peakcut.ir.tags import FissionTag, HostTag, RematTag, SwapTag


def contents(g: Graph, order: Sequence[int], plan: LoopPlan | None) -> list[str]:
    """The lines of the table of contents (for the module docstring)."""
    lines = ["Contents:", f"- inputs: {_inputs(g)}"]
    phases = Counter(g.nodes[nid].phase.value for nid in order)
    lines.append("- phases: " + ", ".join(f"{phase} {n:,} ops" for phase, n in phases.items()))
    lines.extend(f"- {line}" for line in _regions(g, plan))
    applied = _applied(g)
    if applied:
        lines.append(f"- applied: {'; '.join(applied)}")
    kinds = Counter(tag.kind for node in g.nodes.values() for tag in node.tags)
    if kinds:
        lines.append("- ops by node tag: " + ", ".join(f"{kind} {n:,}" for kind, n in sorted(kinds.items())))
    return lines


def _inputs(g: Graph) -> str:
    groups = Counter(input_slot(name)[0] for name in g.input_names)
    return ", ".join(f"{groups[group]:,} in {group}" for group in ("params", "buffers", "state", "batch")
                     if groups[group]) or "none"


def _regions(g: Graph, plan: LoopPlan | None) -> list[str]:
    """One line per fission region: parts, the D-Graph dimension, loop or unrolled."""
    if plan is None:
        return []
    how: dict[int, str] = {}

    def walk(items: Sequence[Item]) -> None:
        for it in items:
            if isinstance(it, Loop):
                how.setdefault(it.fnode, "a loop")
                for part in it.parts[:1]:
                    walk(part)
            elif isinstance(it, Unrolled):
                how[it.fnode] = f"unrolled ({it.reason})"
                walk(it.items)

    walk(plan.items)
    parts: dict[int, int] = {}
    dims: dict[int, set[str]] = {}
    for node in g.nodes.values():
        tag = node.tags.get(FissionTag)
        if tag is None:
            continue
        if tag.n is not None and tag.path and tag.path[-1][0] == tag.region:
            parts[tag.region] = tag.n
        if tag.of is not None:
            dims.setdefault(tag.region, set()).add("?" if tag.component is None else str(tag.component))
    return [f"fission region {fid}: {parts.get(fid, '?')} parts along D-Graph dimension "
            f"{'/'.join(sorted(dims.get(fid, {'?'})))}, {how[fid]}" for fid in sorted(how)]


def _applied(g: Graph) -> list[str]:
    """What transformations left in the graph, counted from its tags."""
    recomputed = [tag for n in g.nodes.values() if (tag := n.tags.get(RematTag)) is not None]
    swaps = sum(1 for n in g.nodes.values() if n.tags.get(SwapTag) is not None and n.op == STORE_OP)
    host = {host_tag.param for n in g.nodes.values() if (host_tag := n.tags.get(HostTag)) is not None}
    kept = g.host_inputs()
    out = []
    if recomputed:
        blocks = sum(1 for tag in recomputed if tag.block)
        within = f", {blocks:,} of them in checkpointed blocks" if blocks else ""
        out.append(f"{_count(len(recomputed), 'recomputed op')} (of {len({t.of for t in recomputed}):,})"
                   f"{within}")
    if swaps:
        out.append(f"{_count(swaps, 'tensor')} swapped out and back in")
    if kept:
        out.append(f"{_count(len(kept), 'input')} kept in host memory between steps")
    if host:
        out.append(f"the update of {_count(len(host), 'parameter')} run on the host")
    return out


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"
