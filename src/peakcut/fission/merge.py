"""Rebuilding a region's boundary outputs from its parts (peakcut.fission.region).

Before the parts, every boundary output t (read outside the region or returned) is
preallocated by a node that outputs t itself (same tensor id and storage, so the readers
outside are untouched): aten.empty_strided for concatenated ("cat") and "same" outputs, zeros
for the reduced ones ("sum", "mean", "nll_mean"). Right after t's last writer in part k, the
part's value is written into it: copy_ into an aten.slice.Tensor view ("cat"), copy_ of the
whole tensor ("same": every part computes the same value, so the loop body is the same for
all parts), add_ ("sum", "mean", "nll_mean"), the writes of one output chained by control
edges. After the last part, "mean" divides by n and "nll_mean" (a mean nll_loss split into
per-part sums) divides the summed loss by the summed total weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from peakcut.fission.boundary import BoundaryOutput
from peakcut.fission.expanded import FissionError
from peakcut.ir.dims import CAT, SAME
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.tags import FissionTag, Path
from peakcut.ir.tensor import TensorMeta, contiguous_strides
from peakcut.transform.rewrite import describe_node, describe_tensor


class PartBuilder(Protocol):
    """What the merges need of the region expander: its graph, adding a node, ordering one."""

    @property
    def g(self) -> Graph: ...

    def add(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, name: str,
            phase: Phase, module: str, tag: FissionTag, what: str,
            outputs: Sequence[int] | None = None) -> Node: ...

    def wait(self, node: int, after: Iterable[int]) -> None: ...


def allocate(b: PartBuilder, outs: list[BoundaryOutput], fid: int,
             path: Path) -> tuple[list[int], dict[int, int]]:
    """Preallocation nodes, in order, and per nll_mean producer the tensor its parts' total
    weights add into (its own total_weight output if that leaves the region, else a
    scratch zero tensor allocated here and freed after the final division)."""
    g = b.g
    allocs: list[int] = []
    totals: dict[int, int] = {}
    leaving = {o.tensor for o in outs}
    for o in outs:
        producer = g.nodes[o.producer]
        meta = g.tensors[o.tensor]
        tag = FissionTag(fid, "alloc", path)
        phase, module = producer.phase, producer.module
        if o.kind in (CAT, SAME):
            node = b.add(
                "aten.empty_strided.default", (list(meta.shape), list(meta.stride)),
                {"dtype": meta.torch_dtype, "device": torch.device(g.device)},
                name=f"{meta.name or o.tensor}_alloc", tag=tag, outputs=[o.tensor],
                what=f"preallocation of {describe_tensor(g, o.tensor)}", phase=phase,
                module=module)
            allocs.append(node.id)
        else:
            allocs.extend(_zeros(b, meta, tag, phase, module, existing=o.tensor))
        if o.kind == "nll_mean":
            total = _total_weight(g, producer)
            if total in leaving:
                totals[o.producer] = total
            else:
                scratch = _zeros(b, g.tensors[total], tag, phase, module, existing=None)
                allocs.extend(scratch)
                totals[o.producer] = g.nodes[scratch[-1]].output_tuple[0]
    return allocs, totals


def _total_weight(g: Graph, producer: Node) -> int:
    """The total_weight output of an nll_loss (its second output; boundary checked there are two)."""
    total = producer.outputs[1]
    if total is None:
        raise FissionError(f"{describe_node(g, producer.id)} returns no total_weight to divide by")
    return total


def _zeros(b: PartBuilder, meta: TensorMeta, tag: FissionTag, phase: Phase, module: str,
           existing: int | None) -> list[int]:
    """Nodes making a zero tensor with meta's layout (outputting `existing` if given)."""
    g = b.g
    opts = {"dtype": meta.torch_dtype, "device": torch.device(g.device)}
    name = f"{meta.name or meta.id}_{'alloc' if existing is not None else 'total'}"
    outputs = [existing] if existing is not None else None
    what = f"zero preallocation of {describe_tensor(g, meta.id)}"
    if existing is None or meta.stride == contiguous_strides(meta.shape):
        node = b.add("aten.zeros.default", (list(meta.shape),), opts, name=name,
                     tag=tag, outputs=outputs, what=what, phase=phase, module=module)
        return [node.id]
    empty = b.add("aten.empty_strided.default", (list(meta.shape), list(meta.stride)), opts,
                  name=name, tag=tag, outputs=outputs, what=what, phase=phase, module=module)
    zero = b.add("aten.zero_.default", (TensorRef(existing),), {}, name=f"{name}_zero",
                 tag=tag, what=what, phase=phase, module=module)
    return [empty.id, zero.id]


def write_part(b: PartBuilder, o: BoundaryOutput, part_of: Mapping[int, int],
               totals: Mapping[int, int], k: int, n: int, fid: int, here: Path, block: list[int],
               last_write: dict[int, int]) -> None:
    """Write part k's value of boundary output `o` into its preallocated tensor."""
    g = b.g
    producer = g.nodes[o.producer]
    meta = g.tensors[o.tensor]
    part = part_of[o.tensor]
    tag = FissionTag(fid, "merge", here, k, n)
    phase, module = producer.phase, producer.module
    base = meta.name or str(o.tensor)
    what = f"writing part {k} of {describe_tensor(g, o.tensor)}"
    writes: list[tuple[int, tuple[Any, ...], str]] = []   # (written tensor, args, op)
    if o.kind == CAT:
        dim = o.dim
        if dim is None:
            raise FissionError(f"internal: {describe_tensor(g, o.tensor)} is concatenated along no "
                               "dimension")
        step = meta.shape[dim] // n
        view = b.add(
            "aten.slice.Tensor", (TensorRef(o.tensor), dim, k * step, (k + 1) * step), {},
            name=f"{base}_slice", what=what, phase=phase, module=module,
            tag=FissionTag(fid, "slice", here, k, n))
        block.append(view.id)
        writes.append((o.tensor, (TensorRef(view.output_tuple[0]), TensorRef(part)),
                       "aten.copy_.default"))
    elif o.kind == SAME:
        writes.append((o.tensor, (TensorRef(o.tensor), TensorRef(part)), "aten.copy_.default"))
    else:
        writes.append((o.tensor, (TensorRef(o.tensor), TensorRef(part)), "aten.add_.Tensor"))
    if o.kind == "nll_mean" and totals[o.producer] != _total_weight(g, producer):
        scratch = totals[o.producer]
        writes.append((scratch, (TensorRef(scratch), TensorRef(part_of[_total_weight(g, producer)])),
                       "aten.add_.Tensor"))
    for target, args, op in writes:
        node = b.add(op, args, {}, name=f"{g.tensors[target].name or target}_write",
                     tag=tag, what=what, phase=phase, module=module)
        b.wait(node.id, [last_write[target]] if target in last_write else [])
        last_write[target] = node.id
        block.append(node.id)


def finish(b: PartBuilder, outs: list[BoundaryOutput], totals: Mapping[int, int], n: int, fid: int,
           path: Path, last_write: dict[int, int]) -> list[int]:
    """Merge nodes after the last part: mean divides by n, nll_mean by the total weight."""
    g = b.g
    merges: list[int] = []
    for o in outs:
        if o.kind not in ("mean", "nll_mean"):
            continue
        producer = g.nodes[o.producer]
        phase, module = producer.phase, producer.module
        tag = FissionTag(fid, "merge", path, n=n)
        name = f"{g.tensors[o.tensor].name or o.tensor}_merge"
        what = f"the merge of {describe_tensor(g, o.tensor)}"
        if o.kind == "mean":
            node = b.add("aten.div_.Scalar", (TensorRef(o.tensor), n), {}, name=name,
                         tag=tag, what=what, phase=phase, module=module)
            deps = [last_write[o.tensor]]
        else:
            total = totals[o.producer]
            node = b.add("aten.div_.Tensor", (TensorRef(o.tensor), TensorRef(total)), {},
                         name=name, tag=tag, what=what, phase=phase, module=module)
            deps = [last_write[o.tensor], last_write[total]]
        b.wait(node.id, deps)
        last_write[o.tensor] = node.id
        merges.append(node.id)
    return merges

