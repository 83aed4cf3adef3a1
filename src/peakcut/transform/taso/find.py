"""Where the TASO-style rules apply: taso_candidates lists applicable sites of every rule, in a
deterministic order, for the optimizer search (which judges them with the cost model).

Sites:
- merge_matmuls: mm / addmm nodes sharing their left operand (same storage, shape, stride,
  offset, dtype), or sharing their right operand, or whose results one tree of additions sums;
  each maximal group, in capture order of its first node;
- split_matmul: nodes merge_matmuls made (un-merge), then every other mm / addmm with at
  least two output features (two near-equal parts), largest output first;
- drop_identity (identities that run a kernel first), cancel_transposes, fold_views: every
  node where the rule applies, in order.
Only sites whose why_not_* says None are returned. Candidates of the different kinds are
interleaved (the first of each kind, then the second of each, ...) so that a limit keeps some
of every kind. Each kind's sites are found lazily (cheap ordering keys first, the costly
why_not_* only on the sites pulled), so a small limit validates each kind's sites only up to
the last one it keeps (all of them for a kind with fewer applicable sites), with the same
result as validating every site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.transform.rewrite import Rewrite, check_candidate_query, describe_node, positions
from peakcut.transform.taso import algebra, matmul, matmul_merge, matmul_split
from peakcut.transform.taso.edit import is_view_op

KINDS = ("merge_matmuls", "split_matmul", "drop_identity", "cancel_transposes", "fold_views")

_SINGLE: dict[str, tuple[Callable, Callable, tuple[str, ...]]] = {
    "drop_identity": (algebra.why_not_drop_identity, algebra.drop_identity,
                      algebra.IDENTITY_OPS),
    "cancel_transposes": (algebra.why_not_cancel_transposes, algebra.cancel_transposes,
                          algebra.TRANSPOSES),
    "fold_views": (algebra.why_not_fold_views, algebra.fold_views, algebra.VIEWS),
}


@dataclass(frozen=True)
class TasoCandidate:
    """One applicable TASO-style rewrite.

    kind: one of KINDS; nodes: the nodes the rule is applied to (the matmuls to merge, the
    matmul to split, or the one node of an algebraic rule); parts: split_matmul's parts (empty:
    un-merge a merged node); description: what the rewrite would do, in words.
    """

    kind: str
    nodes: tuple[int, ...]
    description: str
    parts: tuple[int, ...] = ()

    def apply(self, g: Graph, order: Sequence[int]) -> Rewrite:
        """Apply this candidate's rule to (g, order), the graph and order it was found on (or
        one where its nodes still apply)."""
        if self.kind == "merge_matmuls":
            return matmul_merge.merge_matmuls(g, order, self.nodes)
        if self.kind == "split_matmul":
            return matmul_split.split_matmul(g, order, self.nodes[0], list(self.parts) or None)
        if self.kind in _SINGLE:
            return _SINGLE[self.kind][1](g, order, self.nodes[0])
        raise ValueError(f"unknown TASO candidate kind {self.kind!r}; known: {KINDS}")


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


# The site generators run the why_not_* with checked=True: taso_candidates has verified that
# `order` is an order of g (check_candidate_query) and consumes them before returning.
def _merge_sites(g: Graph, order: Sequence[int]) -> Iterator[TasoCandidate]:
    """Maximal merge groups (merge_groups) whose plan_merge succeeds, validated as pulled."""
    for nodes in merge_groups(g):
        plan = matmul_merge.plan_merge(g, order, nodes, checked=True)
        if not isinstance(plan, str):
            yield TasoCandidate("merge_matmuls", nodes, matmul_merge.merge_summary(g, plan))


def _split_sites(g: Graph, order: Sequence[int]) -> Iterator[TasoCandidate]:
    """Merged nodes (un-merge) in capture order, then the other matmuls, largest output first
    (stable): sorted on the cheap key first, validated one by one as they are pulled."""
    kind = "split_matmul"
    merged: list[tuple[int, dict]] = []
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
            yield TasoCandidate(kind, (nid,), (
                f"un-merge {describe_node(g, nid)} into {len(info['sizes'])} matmuls: "
                f"1 matmul launch becomes {len(info['sizes'])}, its concatenations go"))
    plain.sort(key=lambda p: p[0])
    for _, nid, m in plain:
        if matmul_split.why_not_split_matmul(g, order, nid, 2, checked=True) is None:
            parts = matmul_split.near_equal_parts(g.tensors[m.out].shape[-1], 2)
            yield TasoCandidate(
                kind, (nid,), f"split {describe_node(g, nid)} into {list(parts)} output "
                "features: 1 matmul launch becomes 2, plus weight slices and a cat of "
                f"the {g.tensors[m.out].nbytes:,}-byte result", parts)


def _single_sites(g: Graph, order: Sequence[int], kind: str) -> Iterator[TasoCandidate]:
    """Nodes where the one-node rule `kind` applies, in order; for drop_identity the
    identities that run a kernel first, then the views (each group in order)."""
    why_not, _apply, ops = _SINGLE[kind]
    sites = [nid for nid in g.order if g.nodes[nid].op in ops]
    if kind == "drop_identity":   # stable: kernel identities first, then views
        sites.sort(key=lambda nid: is_view_op(g.nodes[nid].op))
    for nid in sites:
        if why_not(g, order, nid, checked=True) is None:
            effect = ("no kernel changes (views only)" if is_view_op(g.nodes[nid].op)
                      else "one elementwise kernel fewer")
            yield TasoCandidate(kind, (nid,), f"{kind} at {describe_node(g, nid)}: {effect}")


def _sites(g: Graph, order: Sequence[int], kind: str) -> Iterator[TasoCandidate]:
    """The applicable sites of `kind`, lazily, in the order the module docstring gives."""
    if kind == "merge_matmuls":
        return _merge_sites(g, order)
    if kind == "split_matmul":
        return _split_sites(g, order)
    return _single_sites(g, order, kind)


def taso_candidates(g: Graph, order: Sequence[int], limit: int = 32,
                    kinds: Sequence[str] = KINDS) -> list[TasoCandidate]:
    """Applicable TASO-style rewrites of (g, order): at most `limit`, the kinds interleaved in
    the order of `kinds` (first of each kind, then second of each, ...), each kind's sites in
    the order the module docstring gives. Deterministic for a given graph."""
    check_candidate_query(g, order, kinds, KINDS, limit, "TASO candidate")
    live = [_sites(g, order, k) for k in dict.fromkeys(kinds)]
    out: list[TasoCandidate] = []
    while live and len(out) < limit:   # one round: the next site of each kind left
        still: list[Iterator[TasoCandidate]] = []
        for sites in live:
            if len(out) >= limit:
                break
            found = next(sites, None)
            if found is not None:
                out.append(found)
                still.append(sites)
        live = still
    return out
