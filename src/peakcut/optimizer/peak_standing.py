"""What stands at a plan's memory peak, and how much of it peakcut's rules cannot reach.

When a memory limit is not met the user needs to know why, with figures: the bytes live at the
best plan's simulated peak by what they are (parameters, gradients, optimizer state,
activations, the update's temporaries, batch inputs, workspace; a storage that tensors of
several roles share counts as the most lasting of them, ROLE_ORDER), and how many of them
belong to the parts of an enabled fission region: made by a part's ops, made by the region to
collect its parts' results (a boundary output, such as a gradient summed over the parts), or
read by a part's ops. Re-materialization, swapping and the offload rules apply outside enabled regions only
(peakcut.rules.base), so with this F-Tree those bytes stay at the peak whatever else the
search does; a region already at its most parts (n equal to its dimension's length) cannot
shrink them either.

    standing = peak_standing(program, timeline, tree)
    standing.sentence()      # one line for LimitNotMet and the CLI
    standing.as_dict()       # report["peak_standing"]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP
from peakcut.ir.tags import FissionTag
from peakcut.simulate import Timeline
from peakcut.units import format_bytes

KINDS = {"param": "parameters", "buffer": "buffers", "grad": "gradients", "accumulated": "gradients",
         "opt_state": "optimizer state", "activation": "activations", "input": "batch inputs"}
"""Tensor role -> what the breakdown calls it (roles: peakcut.ir.tensor.Role)."""

ROLE_ORDER = ("param", "opt_state", "grad", "accumulated", "buffer", "input", "activation")
"""Which role names a storage that tensors of several roles share (the first of them here): a
weight gradient made by an mm whose result is then viewed as the gradient is a gradient."""

UPDATE_TEMPORARIES = "update temporaries"
"""Bytes the optimizer update makes for itself (sqrt(v) + eps, m / ..., clip coefficients)."""

WORKSPACE = "workspace"
"""Bytes at the peak that no tensor holds: the running ops' scratch memory."""


@dataclass(frozen=True)
class RegionAtPeak:
    """An enabled fission region: its F-Tree node, parts, and its dimension's length."""

    ftree_node: int
    n: int
    length: int
    ops: int

    @property
    def at_most_parts(self) -> bool:
        return self.n >= self.length


@dataclass(frozen=True)
class PeakStanding:
    """The bytes at a plan's peak by kind, and those tied to fission parts (module doc)."""

    peak_bytes: int
    peak_op: str                      # the op running on the compute stream at the peak ('' if idle)
    by_kind: dict[str, int]           # kind -> bytes, largest first; workspace included
    in_parts: dict[str, int]          # kind -> bytes of those tied to a fission region's parts
    regions: tuple[RegionAtPeak, ...]

    @property
    def in_parts_bytes(self) -> int:
        return sum(self.in_parts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "peak_op": self.peak_op, "by_kind": dict(self.by_kind),
                "in_fission_parts": dict(self.in_parts), "in_fission_parts_bytes": self.in_parts_bytes,
                "regions": [{"ftree_node": r.ftree_node, "n": r.n, "length": r.length, "ops": r.ops,
                             "at_most_parts": r.at_most_parts} for r in self.regions],
                "text": self.sentence(), "method": "simulated: the plan's timeline at its peak"}

    def sentence(self) -> str:
        """What stands at the peak, in one sentence (module doc)."""
        where = f" during {self.peak_op}" if self.peak_op else ""
        kinds = ", ".join(f"{k} {format_bytes(b)}" for k, b in self.by_kind.items() if b > 0)
        text = f"at the best plan's peak ({format_bytes(self.peak_bytes)}{where}): {kinds}"
        if not self.regions or self.in_parts_bytes == 0:
            return text
        regions = "; ".join(
            f"F-Tree node {r.ftree_node} ({r.ops} ops) in {r.n} parts"
            + (f" (its most: its dimension has length {r.length})" if r.at_most_parts
               else f" of at most {r.length}") for r in self.regions)
        tied = ", ".join(f"{k} {format_bytes(b)}" for k, b in self.in_parts.items() if b > 0)
        return (f"{text}; {format_bytes(self.in_parts_bytes)} of it ({tied}) is made or read by the "
                f"parts of fission regions ({regions}), where re-materialization, swapping and "
                "offload do not apply")


def peak_standing(g: Graph, timeline: Timeline, tree: FTree) -> PeakStanding:
    """The standing at `timeline`'s peak of program `g` whose enabled regions are `tree`'s."""
    read_in_parts = _storages_read_in_parts(g)
    roles = _storage_roles(g)
    by_kind: dict[str, int] = {}
    in_parts: dict[str, int] = {}
    for spot in timeline.hotspots:
        role = roles.get(spot.storage, spot.role)
        kind = UPDATE_TEMPORARIES if role == "activation" and spot.phase == "optimizer" else KINDS.get(role, "other")
        by_kind[kind] = by_kind.get(kind, 0) + spot.bytes
        if _tied_to_parts(g, spot.node, spot.storage, read_in_parts):
            in_parts[kind] = in_parts.get(kind, 0) + spot.bytes
    workspace = timeline.peak_bytes - sum(by_kind.values())
    if workspace > 0:
        by_kind[WORKSPACE] = workspace
    regions = tuple(RegionAtPeak(f.id, f.n, f.length, len(f.nodes)) for f in tree.enabled())
    peak = None if timeline.peak_node is None else g.nodes[timeline.peak_node]
    peak_op = "" if peak is None else peak.name or peak.op
    return PeakStanding(timeline.peak_bytes, peak_op, dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                        dict(sorted(in_parts.items(), key=lambda kv: -kv[1])), regions)


def _storage_roles(g: Graph) -> dict[int, str]:
    """Storage -> the role it holds: the first in ROLE_ORDER among its tensors' roles, and for
    the device copy a load makes of a host-kept input (offload_param, offload_state), the
    input's role."""
    rank = {role: k for k, role in enumerate(ROLE_ORDER)}
    best: dict[int, str] = {}
    for meta in g.tensors.values():
        role = meta.role.value
        held = best.get(meta.storage)
        if held is None or rank.get(role, len(rank)) < rank.get(held, len(rank)):
            best[meta.storage] = role
    for node in g.nodes.values():
        if node.op == LOAD_OP and g.is_input_copy(node):
            copied = g.tensors[node.input_tuple[0]].role.value
            for t in node.output_tuple:
                best[g.tensors[t].storage] = copied
    return best


def _storages_read_in_parts(g: Graph) -> set[int]:
    """Storages some op of a fission part reads."""
    tensors = g.tensors
    read: set[int] = set()
    for node in g.nodes.values():
        tag = node.tags.get(FissionTag)
        if tag is not None and tag.role == "part":
            read.update(tensors[t].storage for t in node.input_tuple)
    return read


def _tied_to_parts(g: Graph, producer: int | None, storage: int, read_in_parts: set[int]) -> bool:
    """Read by a part's op, or made by a fission expansion's node (a part's op, a boundary
    output's preallocation or merge)."""
    return storage in read_in_parts or (producer is not None and g.nodes[producer].tags.get(FissionTag) is not None)
