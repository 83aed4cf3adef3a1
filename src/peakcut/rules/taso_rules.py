"""The TASO-style rewrites in the registry (the rules themselves: peakcut.transform.taso):
merging matmuls that share an operand or are summed, splitting (or un-merging) a matmul, and
three one-node algebraic simplifications. Their sites are found by transform.taso.find."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.query import Query
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso import algebra, find, matmul_merge, matmul_split


class _TasoRule(RewriteRule):
    """What every TASO-style rule describes alike."""

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"taso: {site.description}"


class MergeMatmulsRule(_TasoRule):
    """Matmuls sharing an operand (or summed together) become one matmul on concatenated operands."""

    kind = "merge_matmuls"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        return find.merge_sites(query.g, query.order)

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        return matmul_merge.why_not_merge_matmuls(g, order, site.nodes)

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return matmul_merge.merge_matmuls(g, order, site.nodes)


class SplitMatmulRule(_TasoRule):
    """A merged matmul un-merged, or a matmul split along its output features."""

    kind = "split_matmul"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        return find.split_sites(query.g, query.order)

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        return matmul_split.why_not_split_matmul(g, order, site.nodes[0], list(site.params) or None)

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return matmul_split.split_matmul(g, order, site.nodes[0], list(site.params) or None)


class _OneNodeRule(_TasoRule):
    """An algebraic rule applied at one node of `ops` (rewrite_at, with its why_not_at twin)."""

    ops: tuple[str, ...] = ()
    views_last = False      # sites: the nodes that run a kernel first, then the views

    @abstractmethod
    def why_not_at(self, g: Graph, order: Sequence[int], node: int, *,
                   checked: bool = False) -> str | None:
        """Why the rule does not apply at `node` (checked: `order` is known to be an order of g)."""

    @abstractmethod
    def rewrite_at(self, g: Graph, order: Sequence[int], node: int) -> Rewrite:
        """The rule applied at `node`."""

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        return find.single_sites(query.g, query.order, self.kind, self.why_not_at, self.ops, self.views_last)

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        return self.why_not_at(g, order, site.nodes[0])

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return self.rewrite_at(g, order, site.nodes[0])


class DropIdentityRule(_OneNodeRule):
    """Readers of an identity (alias, detach, same-shape view, + 0, * 1, ...) read its input."""

    kind = "drop_identity"
    ops = algebra.IDENTITY_OPS
    views_last = True

    def why_not_at(self, g: Graph, order: Sequence[int], node: int, *,
                   checked: bool = False) -> str | None:
        return algebra.why_not_drop_identity(g, order, node, checked=checked)

    def rewrite_at(self, g: Graph, order: Sequence[int], node: int) -> Rewrite:
        return algebra.drop_identity(g, order, node)


class CancelTransposesRule(_OneNodeRule):
    """A transpose undoing the transpose it reads is cancelled."""

    kind = "cancel_transposes"
    ops = algebra.TRANSPOSES

    def why_not_at(self, g: Graph, order: Sequence[int], node: int, *,
                   checked: bool = False) -> str | None:
        return algebra.why_not_cancel_transposes(g, order, node, checked=checked)

    def rewrite_at(self, g: Graph, order: Sequence[int], node: int) -> Rewrite:
        return algebra.cancel_transposes(g, order, node)


class FoldViewsRule(_OneNodeRule):
    """A view of a view reads the inner view's input."""

    kind = "fold_views"
    ops = algebra.VIEWS

    def why_not_at(self, g: Graph, order: Sequence[int], node: int, *,
                   checked: bool = False) -> str | None:
        return algebra.why_not_fold_views(g, order, node, checked=checked)

    def rewrite_at(self, g: Graph, order: Sequence[int], node: int) -> Rewrite:
        return algebra.fold_views(g, order, node)
