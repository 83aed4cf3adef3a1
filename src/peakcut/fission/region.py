"""Expanding one fission region into its n parts, on a private copy of the graph.

RegionExpander.region(S, labels, n, ...) splits the region S along its D-Graph label into n
parts (MAGIS §4.2: inputs sliced or shared, outputs concatenated or reduced):

- S is made contiguous in the order (peakcut.fission.boundary); views of S read only outside
  it are not copied but run whole after the parts, on the merged base;
- the boundary outputs are preallocated before the parts and every part writes its value into
  them (peakcut.fission.merge);
- part k: every input a node reads along the label is an aten.slice.Tensor view of the whole
  tensor (a dense clone where a kernel misreads strides), every node of S is copied with its
  tensor arguments rewired to part tensors and its arguments as peakcut.ir.dims.split_node_args
  gives them; output metas come from running the op on FakeTensors of the part inputs
  (GraphEditor.add_op: a part output aliasing a part input shares its storage);
- control edges of the originals are kept, mapped to the copies; readers outside S wait for the
  last write of what they read; the originals go.

Every node made carries a FissionTag (role "part", "alloc", "slice", "contiguous", "merge",
"keep"). A compact expander builds part 0 only, plus keep-alive aliases of the region's inputs
(peakcut.fission.expand, "Compact expansion"). Anything not provably exact is a FissionError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from peakcut.fission.accumulate import fuse_accumulations
from peakcut.fission.boundary import BoundaryOutput, boundary, copied_members, interleaved
from peakcut.fission.expanded import Expanded, ExpandedRegion, FissionError
from peakcut.fission.merge import allocate, finish, write_part
from peakcut.fission.reuse import ExpansionStep, Snapshot
from peakcut.ir.dims import CAT, SAME, DimRule, PartCall, part_rule, split_node_args
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.infer import InferenceError, Layout, LayoutMemo
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.node_cache import NodeCache
from peakcut.ir.tags import FissionTag, NodeTags, Path
from peakcut.transform.rewrite import describe_node, describe_tensor


class RegionExpander:
    """Expands regions one after the other on a private copy of the graph (a GraphEditor's)."""

    def __init__(self, g: Graph, order: list[int], rules: Mapping[int, DimRule], compact: bool = False,
                 memo: LayoutMemo | None = None, *, next_id: int | None = None,
                 regions: Sequence[ExpandedRegion] = ()) -> None:
        self.edit = GraphEditor(g, next_id=next_id, memo={} if memo is None else memo)
        self.g = self.edit.graph     # the graph being expanded (edit.finish() returns it)
        self.compact = compact
        self.order = list(order)
        self.rules: dict[int, DimRule] = dict(rules)
        self.regions: list[ExpandedRegion] = list(regions)

    @classmethod
    def resumed(cls, snap: Snapshot, compact: bool, memo: LayoutMemo | None) -> RegionExpander:
        """An expander going on from a snapshot (its graph copied: snapshots stay as they are)."""
        return cls(snap.graph, list(snap.order), snap.rules, compact, memo, next_id=snap.next_id,
                   regions=snap.regions)

    def snapshot(self, steps: tuple[ExpansionStep, ...],
                 parts: tuple[tuple[dict[int, int], ...], ...]) -> Snapshot:
        """This expander's state after `steps` (copies: the expander goes on)."""
        return Snapshot(self.g.copy(), tuple(self.order), dict(self.rules), tuple(self.regions),
                        self.edit.next_id, steps, parts)

    # ------------------------------------------------------------ nodes
    def add(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, name: str,
            phase: Phase, module: str, tag: FissionTag, what: str,
            multi_output: bool = False, names: Sequence[str] | None = None,
            inherit: NodeTags | None = None,
            outputs: Sequence[int] | None = None,
            expect: Sequence[tuple[tuple[int, ...], str] | None] | None = None) -> Node:
        """Add a node running `op`; its output metas come from running it on FakeTensors
        (GraphEditor.add_op: views and in-place results live in their input's storage).

        names: output tensor names (default: the node's). outputs: existing tensor ids the
        node outputs instead (a preallocation outputs the tensor it stands for; the layout must
        match). expect: per output, the (shape, dtype) it must have (None: anything). what: the
        node, as error messages name it. tag: its fission tag; inherit: the tags it takes the
        others from (a part copy keeps its original's).
        """
        g = self.g

        def check(layouts: list[Layout | None]) -> None:
            for j, layout in enumerate(layouts):
                want = None if expect is None else expect[j]
                if layout is None:
                    if want is not None:
                        raise FissionError(f"{what}: output {j} is missing in the part")
                    continue
                shape, stride, dtype, _, source = layout
                if want is not None and (shape, dtype) != want:
                    raise FissionError(f"{what}: part output {j} is {shape} {dtype}, but the original "
                                       f"output split along the label is {want[0]} {want[1]}")
                if outputs is not None:
                    meta = g.tensors[outputs[j]]
                    if source[0] != "fresh" or (shape, stride, dtype) != (meta.shape, meta.stride,
                                                                          meta.dtype):
                        raise FissionError(f"{what} cannot reproduce the layout of "
                                           f"{describe_tensor(g, outputs[j])}")

        tags = NodeTags(tag) if inherit is None else inherit.with_tag(tag)
        try:
            return self.edit.add_op(op, args, kwargs, name=name, phase=phase, module=module,
                                    tags=tags, multi_output=multi_output, names=names,
                                    outputs=outputs,
                                    check=None if expect is None and outputs is None else check)
        except InferenceError as e:
            raise FissionError(f"{what} fails on its part inputs: {e.cause}") from None

    def wait(self, node: int, after: Iterable[int]) -> None:
        """Node `node` runs after the nodes `after` too (a control edge each)."""
        deps = set(self.g.control.get(node, ())) | set(after)
        deps.discard(node)
        if deps:
            self.edit.set_control(node, tuple(sorted(deps)))

    # ------------------------------------------------------------ one region
    def region(self, nodes: frozenset[int], labels: Mapping[int, str], n: int, fid: int,
               path: Path, component: int = -1) -> list[dict[int, int]]:
        """Expand region `nodes` of the current graph into n parts; per part, node -> copy."""
        g = self.g
        if n < 2:
            raise FissionError(f"F-Tree node {fid}: n = {n} is not a fission")
        pos = {nid: i for i, nid in enumerate(self.order)}
        members = sorted(nodes, key=pos.__getitem__)
        first, last = pos[members[0]], pos[members[-1]]
        before, after = interleaved(g, nodes, self.order[first:last + 1], fid)
        produced = {t: v for v in members for t in g.nodes[v].output_ids()}
        outs, replayed = boundary(g, self.rules, nodes, members, labels, produced)
        removed = nodes - replayed          # replayed views stay, as outside nodes after S
        control = {v: g.control.get(v, ()) for v in members}
        copied = copied_members(g, members, replayed, control)
        readers = {o.tensor: [u for u in g.users(o.tensor) if u not in removed] for o in outs}

        allocs, totals = allocate(self, outs, fid, path)
        parts: list[dict[int, int]] = []
        blocks: list[list[int]] = []
        last_write: dict[int, int] = {}    # preallocated tensor -> its latest write node
        written: dict[int, list[BoundaryOutput]] = {}  # node -> the boundary outputs it writes (outs order)
        for o in outs:
            written.setdefault(o.writer, []).append(o)
        for k in range(1 if self.compact else n):
            copy_of: dict[int, int] = {}
            part_of: dict[int, int] = {}   # tensor of S -> its part tensor
            slices: dict[tuple[int, int], int] = {}
            block: list[int] = []
            here = (*path, (fid, k))
            for v in copied:
                copy = self._copy(v, labels, n, k, (fid, component), here, produced, part_of,
                                  slices, block)
                copy_of[v] = copy.id
                for t, c in zip(g.nodes[v].outputs, copy.outputs, strict=True):
                    if t is not None and c is not None:   # add() checked they come together
                        part_of[t] = c
                for o in written.get(v, ()):
                    write_part(self, o, part_of, totals, k, n, fid, here, block, last_write)
            parts.append(copy_of)
            blocks.append(block)
        if self.compact:
            blocks[0].extend(self._keep_alive(copied, produced, blocks[0], fid, path))
        merges = finish(self, outs, totals, n, fid, path, last_write)

        # control edges: the originals' (mapped to the copies), readers after the last write
        for copy_of in parts:
            for v in copied:
                self.wait(copy_of[v], [copy_of.get(b, b) for b in control[v]])
        for u, deps in list(g.control.items()):
            if u not in removed and any(d in removed for d in deps):
                mapped = {d for d in deps if d not in removed}
                mapped |= {copy_of[d] for copy_of in parts for d in deps if d in removed}
                self.edit.set_control(u, tuple(sorted(mapped)))
        for o in outs:
            for u in readers[o.tensor]:
                self.wait(u, [last_write[o.tensor]])

        for copy_of in parts:
            for v, c in copy_of.items():
                self.rules[c] = part_rule(self.rules[v], labels[v])
        self._remove([v for v in members if v in removed], {o.tensor for o in outs})
        block_order = allocs + [nid for b in blocks for nid in b] + merges
        after = [v for v in members if v in replayed] + after
        self.order = self.order[:first] + before + block_order + after + self.order[last + 1:]
        self.edit.set_order(self.order)   # Graph.users follows the graph's own order
        self.regions.append(ExpandedRegion(fid, path, labels[members[0]], n, tuple(allocs),
                                           tuple(tuple(b) for b in blocks), tuple(merges),
                                           tuple(v for v in members if v in replayed)))
        return parts

    def _keep_alive(self, copied: list[int], produced: Mapping[int, int], block: list[int], fid: int,
                    path: Path) -> list[int]:
        """Compact expansion: after part 0, an alias of every region input the step does not
        hold anyway, ordered after the part's last touch of the input's storage. In the full
        expansion such an input is touched again by the later parts, so it stays live through
        part 0 as it does here; the aliases cost nothing (role "keep")."""
        g = self.g
        if not block:
            return []
        skip = g.caller_held_storages() | g.host_storages()
        inputs = sorted({t for v in copied for t in g.nodes[v].input_ids() if t not in produced
                         and g.tensors[t].storage not in skip})
        touching: dict[int, list[int]] = {}     # storage -> block nodes reading it
        for b in block:
            for t in g.nodes[b].input_ids():
                touching.setdefault(g.tensors[t].storage, []).append(b)
        keep: list[int] = []
        for t in inputs:
            node = self.add("aten.alias.default", (TensorRef(t),), {},
                             name=f"{g.tensors[t].name or t}_keep", phase=g.nodes[block[-1]].phase,
                             module=g.nodes[block[-1]].module,
                             tag=FissionTag(fid, "keep", path),
                             what=f"keep-alive of {describe_tensor(g, t)}")
            self.wait(node.id, touching.get(g.tensors[t].storage, ()))
            keep.append(node.id)
        return keep

    # ------------------------------------------------------------ copying one node
    def _copy(self, v: int, labels: Mapping[int, str], n: int, k: int, region: tuple[int, int],
              here: Path, produced: Mapping[int, int], part_of: Mapping[int, int],
              slices: dict[tuple[int, int], int], block: list[int]) -> Node:
        """Part k of node v: slices of what it reads along the label, then the copy."""
        g = self.g
        node = g.nodes[v]
        rule, label = self.rules[v], labels[v]
        fid, component = region
        try:
            call = _part_call(g, v, rule, label, n, k)
        except ValueError as e:
            raise FissionError(f"{describe_node(g, v)} cannot be split along {label!r} into {n}: "
                               f"{e}") from None
        mapping: dict[int, int] = {}
        for t, dims in zip(node.input_ids(), rule.inputs, strict=True):
            if t in produced:
                wanted = dims.index(label) if label in dims else None
                mapping[t] = self._part_input(t, produced[t], labels[produced[t]], wanted, v,
                                              part_of)
            elif t in call.narrows:
                dim, start, length = call.narrows[t]
                if (t, dim) not in slices:
                    view = self.add(
                        "aten.slice.Tensor", (TensorRef(t), dim, start, start + length), {},
                        name=f"{g.tensors[t].name or t}_slice", phase=node.phase,
                        module=node.module,
                        tag=FissionTag(fid, "slice", here, k, n),
                        what=f"slice {k} of {describe_tensor(g, t)} for {describe_node(g, v)}")
                    slices[(t, dim)] = view.output_tuple[0]
                    block.append(view.id)
                mapping[t] = slices[(t, dim)]
                if t in call.contiguous:  # a kernel that misreads strided inputs (PartCall doc)
                    if (t, -1 - dim) not in slices:
                        dense = self.add(
                            "aten.clone.default", (TensorRef(slices[(t, dim)]),),
                            {"memory_format": torch.contiguous_format},
                            name=f"{g.tensors[t].name or t}_dense", phase=node.phase,
                            module=node.module,
                            tag=FissionTag(fid, "contiguous", here, k, n),
                            what=f"contiguous slice {k} of {describe_tensor(g, t)} for {describe_node(g, v)}")
                        slices[(t, -1 - dim)] = dense.output_tuple[0]
                        block.append(dense.id)
                    mapping[t] = slices[(t, -1 - dim)]
        expect: list[tuple[tuple[int, ...], str] | None] = []
        names: list[str] = []
        suffix = f"_p{k}"
        for out, dims in zip(node.outputs, rule.outputs, strict=True):
            if out is None:
                expect.append(None)
                names.append("")
                continue
            meta = g.tensors[out]
            shape = tuple(s // n if d == label else s
                          for s, d in zip(meta.shape, dims, strict=True))
            expect.append((shape, meta.dtype))
            names.append(f"{meta.name or out}{suffix}")

        def rewired(ref: TensorRef) -> TensorRef:
            return TensorRef(mapping.get(ref.id, ref.id))

        origin = tag.of if (tag := node.tags.get(FissionTag)) is not None else None
        args, kwargs = map_refs(call.args, rewired), map_refs(dict(call.kwargs), rewired)
        copy = self.add(call.op, args, kwargs,
                         name=f"{node.name or v}{suffix}", phase=node.phase, module=node.module,
                         multi_output=node.multi_output, names=names, expect=expect,
                         tag=FissionTag(fid, "part", here, k, n, v if origin is None else origin, label,
                                        component),
                         inherit=node.tags,
                         what=f"part {k} of {describe_node(g, v)}")
        block.append(copy.id)
        return copy

    def _part_input(self, t: int, producer: int, label: str, wanted: int | None, reader: int,
                    part_of: Mapping[int, int]) -> int:
        """The part tensor of an inner tensor, if the reader reads it as its producer splits it."""
        g = self.g
        rule = self.rules[producer]
        j = g.nodes[producer].outputs.index(t)
        kind = rule.combine(label)[j]
        made = rule.outputs[j].index(label) if kind == CAT else None
        if kind not in (CAT, SAME):
            raise FissionError(f"{describe_node(g, reader)} reads {describe_tensor(g, t)} inside the region, but "
                               f"each part only has a partial result of it (merge {kind!r})")
        if made != wanted:
            raise FissionError(f"{describe_node(g, reader)} reads {describe_tensor(g, t)} split along dimension "
                               f"{wanted}, but its producer splits it along {made}")
        return part_of[t]

    # ------------------------------------------------------------ cleanup and result
    def _remove(self, members: list[int], kept: set[int]) -> None:
        """Drop the original nodes of a region and what only they used."""
        self.edit.remove_nodes(members, keep_tensors=kept)
        for v in members:
            self.rules.pop(v, None)
        self.edit.remove_unused_storages()

    def fuse_accumulations(self) -> None:
        """Let the parts' products add into the summed outputs they make
        (peakcut.fission.accumulate); the last edit before result()."""
        self.order, regions = fuse_accumulations(self.edit, self.order, self.regions)
        self.regions = list(regions)

    def result(self) -> Expanded:
        """The expanded graph (the expander takes no more regions)."""
        self.edit.set_order(self.order)
        g = self.edit.finish()
        copies: dict[int, list[int]] = {}
        for nid in self.order:
            tag = g.nodes[nid].tags.get(FissionTag)
            if tag is not None and tag.of is not None:
                copies.setdefault(tag.of, []).append(nid)
        return Expanded(g, list(self.order), {k: tuple(v) for k, v in copies.items()},
                        tuple(self.regions))


_PART_CALLS: NodeCache[PartCall] = NodeCache()
"""node -> per (label, n, k) its part call, depending on (the rule, the metas of its tensors)."""


def _part_call(g: Graph, v: int, rule: DimRule, label: str, n: int, k: int) -> PartCall:
    """split_node_args(g, v, rule, label, n, k), cached per node object: it reads the node, the
    rule and the metas of the node's tensors only, so a node expanded again (another state of
    an optimizer search) with an equal rule and equal metas gets the same part call."""
    node = g.nodes[v]
    tensors = g.tensors
    metas = tuple([tensors[t] for t in node.input_tuple] + [tensors[t] for t in node.output_tuple])
    depends = (rule, metas)
    call = _PART_CALLS.get(node, depends, slot=(label, n, k))
    if call is None:
        call = split_node_args(g, v, rule, label, n, k)
        _PART_CALLS.put(node, call, depends, slot=(label, n, k))
    return call
