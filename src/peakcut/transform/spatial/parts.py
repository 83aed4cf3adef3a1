"""The builder of a region's parts on one GraphEditor: the nodes it adds, and the row slices
(zero-padded where they leave the image) of the tensors the parts read."""

from __future__ import annotations

from typing import Any

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.transform.spatial.ops import ROWS, Rows
from peakcut.transform.spatial.region import Region


class Parts:
    """Builds the parts of one region on a GraphEditor."""

    def __init__(self, g: Graph, region: Region, n: int) -> None:
        self.g, self.n = g, n
        self.edit = GraphEditor(g)
        self.made: list[int] = []
        self.inside = set(region.nodes)
        self.handed = set(region.rows) | set(region.added)
        self.slices: dict[tuple[int, Rows, int], int] = {}   # of whole tensors, in the part being built

    def add(self, op: str, args: tuple[Any, ...], like: Node, name: str, multi_output: bool = False,
            kwargs: dict[str, Any] | None = None) -> Node:
        node = self.edit.add_op(op, args, kwargs or {}, name=name, phase=like.phase, module=like.module,
                                multi_output=multi_output)
        self.made.append(node.id)
        return node

    def rows_of(self, t: int, rows: Rows, part: dict[int, tuple[int, Rows]], like: Node, dim: int = ROWS) -> int:
        """Tensor `t` cut to `rows` (within its height, dim `dim`): its part tensor or a slice of it."""
        if t in part:
            tensor, have = part[t]
        else:
            tensor, have = t, Rows(0, self.g.tensors[t].shape[dim])
        if rows == have:
            return tensor
        key = (t, rows, dim)
        if t not in part and key in self.slices:      # a whole tensor two nodes of the part read
            return self.slices[key]
        name = f"{self.g.tensors[t].name or t}_rows{rows.start}_{rows.stop}"
        view = self.add("aten.slice.Tensor", (TensorRef(tensor), dim, rows.start - have.start,
                                              rows.stop - have.start), like, name)
        if t not in part:
            self.slices[key] = view.output_ids()[0]
        return view.output_ids()[0]

    def padded(self, t: int, rows: Rows, height: int, part: dict[int, tuple[int, Rows]], like: Node) -> tuple[int, int]:
        """Tensor `t`'s rows `rows` (unclipped), zero-padded where they leave the image: the
        tensor and the rows of padding on top."""
        inner = rows.clip(height)
        x = self.rows_of(t, inner, part, like)
        top, bottom = inner.start - rows.start, rows.stop - inner.stop
        if top or bottom:
            name = f"{self.g.tensors[t].name or t}_rows{rows.start}_{rows.stop}_padded"
            x = self.add("aten.constant_pad_nd.default", (TensorRef(x), [0, 0, top, bottom], 0.0),
                         like, name).output_ids()[0]
        return x, top
