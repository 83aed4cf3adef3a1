"""Which results a step places in its arena, where, and what stays outside it.

    ap = plan_arena(g, order)                 # probes the out overloads on g's device
    ap.source                                 # the program, taking a keyword `arena`
    ap.layout.arena_bytes, ap.unplanned_peak_bytes, ap.needed_bytes
    ap.unplanned                              # each storage outside the arena: node, bytes, why

A node's results go into the arena when the node makes them (each a storage no node touched
before), the step does not return them, its op has an out overload (codegen.out_variants)
that the probe finds writes in place (codegen.arena_probe), it draws no random numbers (an
out overload need not draw as the functional one does), it runs on the compute stream (no
host copy, collective or op on the host), no collective touches its storage (they may run
asynchronously until their wait), nor on CUDA a copy stream,
and the code that writes it is the ordinary call (not a hook's: swaps, the update's list
calls), and no hook keeps it past its last use. Everything else the step allocates as it
does without an arena: the unplanned remainder, listed with its bytes and why.

The offsets are peakcut.memory.layout's over the placed storages in the order's positions (one
stream). The step then needs the caller's storages (held), the arena, and at most the peak
of the unplanned storages' live bytes plus each op's workspace (the workspace model):
`needed_bytes`, the figure a memory limit bounds with the arena.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from peakcut.codegen.arena import Placement
from peakcut.codegen.arena_probe import probe_out_variants
from peakcut.codegen.hooks import CodeHook
from peakcut.codegen.out_variants import OutVariant, out_variant
from peakcut.codegen.source import placed_source
from peakcut.ir.collectives import COLLECTIVE_OPS
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.ops import COPY_DIRECTION
from peakcut.ir.registry import draws_random
from peakcut.memory.layout import Layout, plan_layout
from peakcut.memory.workspace import WorkspaceSpec, order_workspace

HOOK_CODE = "written by a code hook (swap, update list call, ...) or kept past its last use"


@dataclass(frozen=True)
class Unplanned:
    """A storage the step allocates outside the arena: its bytes, the node that makes it, why."""

    storage: int
    bytes: int
    node: str
    op: str
    why: str


@dataclass(frozen=True)
class ArenaPlan:
    """A program with its arena (module doc): the source, the placement and layout, the nodes
    placed, the storages left outside with why, and the bytes the step needs."""

    source: str
    placement: Placement
    layout: Layout
    placed: frozenset[int]
    unplanned: tuple[Unplanned, ...]
    unplanned_peak_bytes: int
    held_bytes: int
    probed: bool

    @property
    def arena_bytes(self) -> int:
        return self.layout.arena_bytes

    @property
    def needed_bytes(self) -> int:
        """Held + arena + the unplanned storages' and workspace's peak: what the step needs."""
        return self.held_bytes + self.arena_bytes + self.unplanned_peak_bytes

    def as_dict(self, listed: int = 50) -> dict[str, Any]:
        """The report's entry: the figures, and the `listed` largest unplanned storages."""
        by_why: dict[str, int] = {}
        for u in self.unplanned:
            by_why[u.why] = by_why.get(u.why, 0) + u.bytes
        largest = sorted(self.unplanned, key=lambda u: -u.bytes)[:listed]
        return {"arena_bytes": self.arena_bytes, "unplanned_peak_bytes": self.unplanned_peak_bytes,
                "held_bytes": self.held_bytes, "needed_bytes": self.needed_bytes,
                "placed_nodes": len(self.placed), "placed_storages": len(self.layout.offsets),
                "unplanned_storages": len(self.unplanned), "unplanned_bytes_by_why": by_why,
                "unplanned": [{"node": u.node, "op": u.op, "bytes": u.bytes, "why": u.why} for u in largest],
                "layout": self.layout.as_dict(),
                "method": "simulated (the program's order; workspace model) with out overloads "
                          + ("probed on the device" if self.probed else "not probed (no real device)")}


def plan_arena(g: Graph, order: Sequence[int], *, device: str | None = None, workspace: WorkspaceSpec = "auto",
               extra: Sequence[CodeHook] = (), title: str = "", peak: str = "n/a", probe: bool = True,
               time_limit: float = 1.0, probes: dict[tuple[Any, ...], str | None] | None = None,
               exact: bool | str = "auto") -> ArenaPlan:
    """The program (g, order) with its arena (module doc); `device`: where the out overloads are
    probed (default g.device; probe=False or a device other than cpu/cuda: not probed); probes:
    earlier verdicts on that device by call (codegen.arena_probe.call_key), used and added to;
    time_limit and exact: the layout's (peakcut.memory.layout.plan_layout)."""
    order = list(order)
    variants, why = _candidates(g, order)
    where = device or g.device
    probed = probe and where.split(":")[0] in ("cpu", "cuda")
    if probed:
        for nid, reason in probe_out_variants(g, variants, where, probes).items():
            why[nid] = reason
            del variants[nid]
    while True:
        mine = {g.tensors[t].storage for nid in variants for t in g.nodes[nid].output_ids()}
        life_storages = set(g.storages) - mine
        layout = plan_layout(g, order, unplanned=life_storages, time_limit=time_limit, exact=exact)
        placement = Placement(offsets=layout.offsets, outs=dict(variants), arena_bytes=layout.arena_bytes)
        source, placed = placed_source(g, order, title, peak, extra, placement)
        if placed == set(variants):
            break
        for nid in set(variants) - placed:
            why[nid] = HOOK_CODE
            del variants[nid]
    unplanned = _unplanned(g, order, layout, why)
    ws = order_workspace(g, order, workspace)
    return ArenaPlan(source=source, placement=placement, layout=layout, placed=frozenset(placed),
                     unplanned=unplanned, unplanned_peak_bytes=_outside_peak(layout, ws),
                     held_bytes=layout.held_bytes, probed=probed)


def with_source(ap: ArenaPlan, g: Graph, order: Sequence[int], title: str, peak: str,
                extra: Sequence[CodeHook]) -> ArenaPlan:
    """`ap` (an arena plan of program (g, order)) with its source written for this title,
    peak line and code hooks; GraphError when the program places other nodes than ap's."""
    source, placed = placed_source(g, list(order), title, peak, extra, ap.placement)
    if placed != ap.placed:
        raise GraphError(f"the arena plan places {len(ap.placed)} nodes, this program {len(placed)}: "
                         "it was planned for another program or other code hooks")
    return replace(ap, source=source)


def _candidates(g: Graph, order: Sequence[int]) -> tuple[dict[int, OutVariant], dict[int, str]]:
    """The nodes whose results may be placed, with their out overloads; why each other node
    making a storage may not."""
    held = g.caller_held_storages() | g.host_storages()
    off_stream: set[int] = set()        # storages an op beside the compute stream may touch at any time
    cuda = g.device.startswith("cuda")
    for nid in order:
        node = g.nodes[nid]
        if node.op in COLLECTIVE_OPS or (cuda and _off_stream(node.op, node.tags.on_host)):
            off_stream.update(g.tensors[t].storage for t in (*node.input_ids(), *node.output_ids()))
    touched: set[int] = set()
    variants: dict[int, OutVariant] = {}
    why: dict[int, str] = {}
    for nid in order:
        node = g.nodes[nid]
        made = [g.tensors[t].storage for t in node.output_ids()]
        fresh = [s for s in made if s not in touched and s not in held]
        touched.update(g.tensors[t].storage for t in node.input_ids())
        touched.update(made)
        if not fresh:
            continue
        reason = _refusal(g, node, made, fresh, off_stream, g.output_storages())
        variant = out_variant(node.op) if reason is None else None
        if reason is None and variant is None:
            reason = "its op has no out overload"
        if variant is not None:
            variants[nid] = variant
        else:
            why[nid] = reason or ""
    return variants, why


def _off_stream(op: str, on_host: bool) -> bool:
    return on_host or op in COPY_DIRECTION or op in COLLECTIVE_OPS


def _refusal(g: Graph, node: Any, made: list[int], fresh: list[int], off_stream: set[int],
             returned: set[int]) -> str | None:
    """Why node's results may not be placed, or None."""
    if _off_stream(node.op, node.tags.on_host):
        return "a host copy, collective or op on the host"
    if any(s in returned for s in made):
        return "the step returns it"
    if None in node.outputs or len(set(made)) != len(made) or fresh != made:
        return "not every result is a new storage (a view, an in-place result or an unused one)"
    if any(s in off_stream for s in made):
        return "a copy stream or a collective touches it"
    if any(g.storages[s] == 0 for s in made):
        return "an empty tensor"
    if draws_random(node.op, node.args, node.kwargs):
        return "it draws random numbers"
    device = node.kwargs.get("device")
    if device is not None and torch.device(device) != torch.device(g.device):
        return "it makes a tensor on another device"
    if node.kwargs.get("pin_memory"):
        return "it makes a pinned host tensor"
    return None


def _unplanned(g: Graph, order: Sequence[int], layout: Layout, why: dict[int, str]) -> tuple[Unplanned, ...]:
    maker: dict[int, int] = {}
    for nid in order:
        for t in g.nodes[nid].output_ids():
            maker.setdefault(g.tensors[t].storage, nid)
    found = []
    for s in layout.unplanned:
        made_by = maker.get(s)
        if made_by is None:
            found.append(Unplanned(storage=s, bytes=g.storages[s], node="?", op="?", why="not made by a node"))
            continue
        node = g.nodes[made_by]
        found.append(Unplanned(storage=s, bytes=g.storages[s], node=node.name or str(made_by), op=node.op,
                               why=why.get(made_by, "")))
    return tuple(found)


def _outside_peak(layout: Layout, workspace: np.ndarray) -> int:
    """Peak of the unplanned storages' live bytes plus each op's workspace while it runs."""
    life = layout.lifetimes
    placed = np.fromiter((s in layout.offsets for s in life.storages), dtype=np.bool_, count=len(life.storages))
    delta = np.zeros(life.points + 1, dtype=np.int64)
    size = np.where(placed, 0, life.size)
    np.add.at(delta, np.minimum(life.alloc_at, life.points), size)
    np.subtract.at(delta, np.minimum(life.free_at, life.points), size)
    if len(workspace):
        np.add.at(delta, life.node_start, workspace)
        np.subtract.at(delta, life.node_end, workspace)
    return int(np.cumsum(delta).max()) if len(delta) else 0
