"""The rows each part of a region computes of each tensor made in it: the rows it hands on
that the part owns, and the rows its readers in the region need (their halos)."""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.transform.spatial.ops import (
    CONV,
    CONV_BACKWARD,
    NLL_BACKWARD,
    NLL_FORWARD,
    ROWS,
    Rows,
    Window,
    conv_window,
    owned,
    split_inputs,
)


def needs(g: Graph, nodes: Sequence[int], handed_rows: Sequence[int], k: int, n: int) -> dict[int, Rows]:
    """Per tensor made by the region `nodes` (in order), the rows part k of n computes of it;
    `handed_rows` are the tensors handed on whose rows the parts write (package doc)."""
    need: dict[int, Rows] = {}
    made = {t for v in nodes for t in g.nodes[v].output_ids()}
    for t in handed_rows:
        need[t] = owned(g.tensors[t].shape[ROWS], k, n)

    def want(t: int, rows: Rows) -> None:
        if t in made:
            rows = rows.clip(g.tensors[t].shape[ROWS])
            need[t] = rows.hull(need.get(t))

    for v in reversed(nodes):
        node = g.nodes[v]
        if node.op == CONV_BACKWARD:
            go, x = node.args[0], node.args[1]
            w = conv_window(g, node, 2, 4)
            if isinstance(go, TensorRef) and isinstance(x, TensorRef) and isinstance(w, Window):
                mine = owned(g.tensors[go.id].shape[ROWS], k, n)
                want(go.id, mine)
                want(x.id, w.reads(mine))
            continue
        if node.op == NLL_FORWARD:       # its sum counts each row once: the part's own rows
            x = node.args[0].id
            want(x, owned(g.tensors[x].shape[ROWS], k, n))
            continue
        (out,) = node.output_ids()
        rows = need.get(out)
        if rows is None:
            continue
        if node.op == NLL_BACKWARD:
            want(node.args[1].id, rows)
            continue
        if node.op == CONV:
            w = conv_window(g, node, 1, 3)
            if isinstance(node.args[0], TensorRef) and isinstance(w, Window):
                want(node.args[0].id, w.reads(rows))
            continue
        split = split_inputs(g, node)
        for t in split if isinstance(split, list) else ():
            want(t, rows)
    return {t: r for t, r in need.items() if t in made}
