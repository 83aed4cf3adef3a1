"""Where the TASO-style rules apply: the applicable sites of each rule, lazily, in a
deterministic order (the rules' `sites` hooks, peakcut.rules.taso_rules; the registry
interleaves them for the optimizer search, which judges them with the cost model).

Sites:
- merge_matmuls: mm / addmm nodes sharing their left operand (same storage, shape, stride,
  offset, dtype), or sharing their right operand, or whose results one tree of additions sums;
  each maximal group, in capture order of its first node;
- split_matmul: nodes merge_matmuls made (un-merge), then every other mm / addmm with at
  least two output features (two near-equal parts), largest output first;
- drop_identity (identities that run a kernel first), cancel_transposes, fold_views: every
  node where the rule applies, in order.
Only sites whose why_not_* says None are yielded. Each kind's sites are found lazily (cheap
ordering keys first, the costly why_not_* only on the sites pulled), so a caller that stops
early validates only the sites it pulled, with the same result as validating every site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.transform.rewrite import describe_node, positions
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso import matmul, matmul_merge, matmul_split
from peakcut.transform.taso.edit import is_view_op
from peakcut.transform.taso.tag import TasoTag


def _key(g: Graph, t: int) -> tuple:
    m = g.tensors[t]
    return (m.storage, m.shape, m.stride, m.storage_offset, m.dtype)


def _sum_root(g: Graph, m: matmul.Matmul) -> int | None:
    """The topmost addition of the chain of sole-reader additions summing m's output (read
    directly or through one view)."""

    def sole(t: int) -> int | None:
        readers = g.users(t)
        return readers[0] if len(readers) == 1 else None

    r = sole(m.out)
    if r is not None and is_view_op(g.nodes[r].op):
        outs = g.nodes[r].output_ids()
        r = sole(outs[0]) if len(outs) == 1 else None
    if r is None or g.nodes[r].op != matmul.ADD:
        return None
    while True:
        outs = g.nodes[r].output_ids()
        up = sole(outs[0]) if len(outs) == 1 else None
        if up is None or g.nodes[up].op != matmul.ADD:
            return r
        r = up


def merge_groups(g: Graph) -> list[tuple[int, ...]]:
    """Maximal groups of matmuls sharing an operand or summed together, by first node."""
    pos = positions(g.order)
    groups: dict[tuple, list[int]] = {}
    for nid in g.order:
        if g.nodes[nid].op not in matmul.MATMULS:
            continue
        m = matmul.parse_matmul(g, nid)
        if isinstance(m, str):
            continue
        groups.setdefault(("left", m.op, _key(g, m.a)), []).append(nid)
        groups.setdefault(("right", m.op, _key(g, m.b)), []).append(nid)
        if m.op == matmul.MM:
            root = _sum_root(g, m)
            if root is not None:
                groups.setdefault(("sum", root), []).append(nid)
    found = {tuple(v) for v in groups.values() if len(v) > 1}
    return sorted(found, key=lambda v: (pos[v[0]], v))


# The site generators run the why_not_* with checked=True: their caller (the registry's
# rewrite_candidates) has verified that `order` is an order of g and consumes them before
# returning.
def merge_sites(g: Graph, order: Sequence[int]) -> Iterator[RewriteSite]:
    """Maximal merge groups (merge_groups) whose plan_merge succeeds, validated as pulled."""
    for nodes in merge_groups(g):
        plan = matmul_merge.plan_merge(g, order, nodes, checked=True)
        if not isinstance(plan, str):
            yield RewriteSite("merge_matmuls", nodes, matmul_merge.merge_summary(g, plan))


def split_sites(g: Graph, order: Sequence[int]) -> Iterator[RewriteSite]:
    """Merged nodes (un-merge) in capture order, then the other matmuls, largest output first
    (stable): sorted on the cheap key first, validated one by one as they are pulled."""
    kind = "split_matmul"
    merged: list[tuple[int, TasoTag]] = []
    plain: list[tuple[int, int, matmul.Matmul]] = []
    for nid in g.order:
        if g.nodes[nid].op not in matmul.MATMULS:
            continue
        m = matmul.parse_matmul(g, nid)
        if isinstance(m, str):
            continue
        info = matmul_merge.merged_info(g, nid)
        if info is not None:
            merged.append((nid, info))
        elif g.tensors[m.out].shape[-1] >= 2:
            plain.append((-g.tensors[m.out].nbytes, nid, m))
    for nid, info in merged:
        if matmul_split.why_not_split_matmul(g, order, nid, checked=True) is None:
            yield RewriteSite(kind, (nid,), (
                f"un-merge {describe_node(g, nid)} into {len(info.sizes)} matmuls: "
                f"1 matmul launch becomes {len(info.sizes)}, its concatenations go"))
    plain.sort(key=lambda p: p[0])
    for _, nid, m in plain:
        if matmul_split.why_not_split_matmul(g, order, nid, 2, checked=True) is None:
            parts = matmul_split.near_equal_parts(g.tensors[m.out].shape[-1], 2)
            yield RewriteSite(
                kind, (nid,), f"split {describe_node(g, nid)} into {list(parts)} output "
                "features: 1 matmul launch becomes 2, plus weight slices and a cat of "
                f"the {g.tensors[m.out].nbytes:,}-byte result", parts)


def single_sites(g: Graph, order: Sequence[int], kind: str, why_not: Callable[..., str | None],
                 ops: Sequence[str], views_last: bool = False) -> Iterator[RewriteSite]:
    """Nodes of `ops` where the one-node rule `kind` applies (why_not(g, order, nid,
    checked=True) is None), in order; with views_last the nodes that run a kernel first, then
    the views (each group in order)."""
    sites = [nid for nid in g.order if g.nodes[nid].op in ops]
    if views_last:   # stable: kernel nodes first, then views
        sites.sort(key=lambda nid: is_view_op(g.nodes[nid].op))
    for nid in sites:
        if why_not(g, order, nid, checked=True) is None:
            effect = ("no kernel changes (views only)" if is_view_op(g.nodes[nid].op)
                      else "one elementwise kernel fewer")
            yield RewriteSite(kind, (nid,), f"{kind} at {describe_node(g, nid)}: {effect}")
