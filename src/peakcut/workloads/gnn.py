"""Graph neural networks trained on the full graph, written in plain PyTorch as users write them.

Four models over an edge list (``src``, ``dst``: one entry per edge, messages flow from
``src`` to ``dst``), each 2 layers by default:

* GCN (Kipf and Welling): ``H' = D^-1/2 (A + I) D^-1/2 H W``; the messages are
  ``index_select``-ed rows scaled by the edge's normalisation and summed per destination with
  ``index_add_``; :class:`SparseGCN` computes the same layer with ``torch.sparse.mm`` over a
  COO adjacency built in the forward from the edge list;
* GraphSAGE with mean aggregation: ``W_self h_v + W_neigh mean(h_u for u -> v)``;
* GIN: ``MLP((1 + eps) h_v + sum(h_u for u -> v))`` with a learned ``eps``;
* GAT: attention over edges, ``alpha = softmax over v's in-edges of LeakyReLU(a_s z_u + a_d z_v)``,
  the edge softmax made of ``scatter_reduce`` (amax, detached, for stability) and ``index_add_``.

The loss is ROC's: cross-entropy at every vertex, weighted by the boolean training mask and
averaged over the training vertices (:func:`masked_loss`), so the step's shapes do not depend
on the mask's values. :func:`indexed_loss` is the other way users write it,
``cross_entropy(out[mask], labels[mask])``, whose sizes depend on the mask (capture specialises
on the mask it sees, see ``peakcut.capture``).

Sizes (:data:`SIZES`): ``paper`` is the dataset's shape (:mod:`.graphs`, Table 4.4 of ROC) with
hidden width 256 (GAT: 8 heads of 32) on the meta device; ``medium`` a 20,000-vertex,
400,000-edge graph of the dataset's feature width and classes, hidden 128 (GAT: 4 heads of 32),
whose eager Adam step takes about 1-3 s and 0.05-1 GB on a 2-core CPU (bench.medium_sizes);
``tiny`` 64 vertices, 384 edges, 16 features, 4 classes, hidden 8 (GAT: 2 heads of 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from peakcut.workloads.graphs import PAPER_SHAPES, GraphShape, synthetic_graph

Batch = tuple[torch.Tensor, ...]
MODELS: tuple[str, ...] = ("gcn", "sage", "gin", "gat", "gcn-sparse")


@dataclass(frozen=True)
class GnnSize:
    """A graph's shape and the model's hidden width at one size (GAT: heads x head width)."""

    graph: GraphShape
    hidden: int
    heads: int


def size_of(dataset: str, size: str) -> GnnSize:
    """The graph and widths of `dataset` ('reddit' or 'amazon') at `size`."""
    if dataset not in PAPER_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(PAPER_SHAPES)}")
    paper = PAPER_SHAPES[dataset]
    if size == "paper":
        return GnnSize(paper, hidden=256, heads=8)
    if size == "medium":
        return GnnSize(GraphShape(20_000, 400_000, paper.features, paper.classes), hidden=128, heads=4)
    if size == "tiny":
        return GnnSize(GraphShape(64, 384, 16, 4), hidden=8, heads=2)
    raise ValueError(f"unknown size {size!r}; expected paper, medium or tiny")


def _in_degree(dst: torch.Tensor, vertices: int, dtype: torch.dtype) -> torch.Tensor:
    ones = torch.ones(dst.shape[0], dtype=dtype, device=dst.device)
    return torch.zeros(vertices, dtype=dtype, device=dst.device).index_add_(0, dst, ones)


def _sum_over_in_edges(messages: torch.Tensor, dst: torch.Tensor, vertices: int) -> torch.Tensor:
    """Per destination vertex, the sum of its in-edges' messages ([E, ...] -> [V, ...])."""
    out = messages.new_zeros((vertices, *messages.shape[1:]))
    return out.index_add_(0, dst, messages)


class GCNLayer(nn.Module):
    """One GCN layer over an edge list, self-loops added: ``norm-weighted sum of (H W)[u]`` + bias."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(fan_in, fan_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(fan_out))

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, dinv: torch.Tensor) -> torch.Tensor:
        z = self.lin(h)
        weight = (dinv.index_select(0, src) * dinv.index_select(0, dst)).unsqueeze(1)
        messages = z.index_select(0, src) * weight
        return _sum_over_in_edges(messages, dst, h.shape[0]) + z * (dinv * dinv).unsqueeze(1) + self.bias


class GCN(nn.Module):
    """Two GCN layers with a ReLU between them."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GCNLayer(features, hidden)
        self.conv2 = GCNLayer(hidden, classes)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        dinv = (_in_degree(dst, x.shape[0], x.dtype) + 1).rsqrt()      # degrees with the self-loop
        h = F.relu(self.conv1(x, src, dst, dinv))
        return self.conv2(h, src, dst, dinv)


class SparseGCN(nn.Module):
    """GCN with the propagation as ``torch.sparse.mm`` over ``D^-1/2 A D^-1/2`` in COO form."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.lin1 = nn.Linear(features, hidden)
        self.lin2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        v = x.shape[0]
        dinv = (_in_degree(dst, v, x.dtype) + 1).rsqrt()
        values = dinv.index_select(0, src) * dinv.index_select(0, dst)
        adj = torch.sparse_coo_tensor(torch.stack([dst, src]), values, (v, v))
        self_weight = (dinv * dinv).unsqueeze(1)
        z = self.lin1(x)
        h = F.relu(torch.sparse.mm(adj, z) + z * self_weight)
        z = self.lin2(h)
        return torch.sparse.mm(adj, z) + z * self_weight


class SAGELayer(nn.Module):
    """GraphSAGE with mean aggregation: ``W_self h_v + W_neigh mean of h_u over v's in-edges``."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.lin_self = nn.Linear(fan_in, fan_out)
        self.lin_neigh = nn.Linear(fan_in, fan_out, bias=False)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, deg: torch.Tensor) -> torch.Tensor:
        mean = _sum_over_in_edges(h.index_select(0, src), dst, h.shape[0]) / deg.clamp(min=1).unsqueeze(1)
        return self.lin_self(h) + self.lin_neigh(mean)


class GraphSAGE(nn.Module):
    """Two mean-aggregation SAGE layers with a ReLU between them."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGELayer(features, hidden)
        self.conv2 = SAGELayer(hidden, classes)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        deg = _in_degree(dst, x.shape[0], x.dtype)
        return self.conv2(F.relu(self.conv1(x, src, dst, deg)), src, dst, deg)


class GINLayer(nn.Module):
    """GIN: ``MLP((1 + eps) h_v + sum of h_u over v's in-edges)``, ``eps`` learned."""

    def __init__(self, fan_in: int, fan_out: int, hidden: int) -> None:
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(()))
        self.mlp = nn.Sequential(nn.Linear(fan_in, hidden), nn.ReLU(), nn.Linear(hidden, fan_out))

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return self.mlp((1 + self.eps) * h + _sum_over_in_edges(h.index_select(0, src), dst, h.shape[0]))


class GIN(nn.Module):
    """Two GIN layers with a ReLU between them."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GINLayer(features, hidden, hidden)
        self.conv2 = GINLayer(hidden, classes, hidden)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x, src, dst)), src, dst)


class GATLayer(nn.Module):
    """Multi-head graph attention: per head, softmax over v's in-edges of
    ``LeakyReLU(a_src . z_u + a_dst . z_v)`` weights the messages ``z_u``; heads concatenated."""

    def __init__(self, fan_in: int, heads: int, head_width: int) -> None:
        super().__init__()
        self.heads, self.head_width = heads, head_width
        self.lin = nn.Linear(fan_in, heads * head_width, bias=False)
        self.att_src = nn.Parameter(torch.randn(heads, head_width) / head_width ** 0.5)
        self.att_dst = nn.Parameter(torch.randn(heads, head_width) / head_width ** 0.5)
        self.bias = nn.Parameter(torch.zeros(heads * head_width))

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        v = h.shape[0]
        z = self.lin(h).view(v, self.heads, self.head_width)
        score_src, score_dst = (z * self.att_src).sum(-1), (z * self.att_dst).sum(-1)          # [V, heads]
        scores = F.leaky_relu(score_src.index_select(0, src) + score_dst.index_select(0, dst), 0.2)   # [E, heads]
        index = dst.unsqueeze(1).expand_as(scores)
        peak = scores.new_zeros(v, self.heads).scatter_reduce(0, index, scores.detach(), "amax", include_self=False)
        weights = (scores - peak.index_select(0, dst)).exp()
        total = _sum_over_in_edges(weights, dst, v)
        alpha = weights / total.index_select(0, dst)
        out = _sum_over_in_edges(z.index_select(0, src) * alpha.unsqueeze(2), dst, v)
        return out.reshape(v, self.heads * self.head_width) + self.bias


class GAT(nn.Module):
    """A multi-head GAT layer, ELU, and a one-head GAT layer to the classes."""

    def __init__(self, features: int, hidden: int, classes: int, heads: int) -> None:
        super().__init__()
        self.conv1 = GATLayer(features, heads, hidden // heads)
        self.conv2 = GATLayer(heads * (hidden // heads), 1, classes)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.elu(self.conv1(x, src, dst)), src, dst)


def build_model(model: str, size: GnnSize) -> nn.Module:
    """The `model` (one of MODELS) for a graph and widths of `size`."""
    g = size.graph
    if model == "gcn":
        return GCN(g.features, size.hidden, g.classes)
    if model == "gcn-sparse":
        return SparseGCN(g.features, size.hidden, g.classes)
    if model == "sage":
        return GraphSAGE(g.features, size.hidden, g.classes)
    if model == "gin":
        return GIN(g.features, size.hidden, g.classes)
    if model == "gat":
        return GAT(g.features, size.hidden, g.classes, size.heads)
    raise ValueError(f"unknown GNN model {model!r}; expected one of {', '.join(MODELS)}")


def make_gnn(model: str, dataset: str, size: str, batch_size: int) -> tuple[nn.Module, Batch]:
    """`model` on a synthetic graph of `dataset`'s shape at `size`, and the batch
    ``(x, src, dst, labels, train_mask)``; `batch_size` must be 1 (one full graph). The graph's
    seed is drawn from torch's CPU generator, which Workload.build seeds."""
    if batch_size != 1:
        raise ValueError(f"batch_size={batch_size}: a full-graph GNN step trains on one graph (batch 1)")
    dims = size_of(dataset, size)
    graph_seed = int(torch.randint(2**62, (), device="cpu"))     # from the seeded ambient generator
    return build_model(model, dims), synthetic_graph(dims.graph, graph_seed).as_tuple()


def masked_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the training vertices, as a mask-weighted sum over all vertices."""
    x, src, dst, labels, train_mask = batch
    per_vertex = F.cross_entropy(model(x, src, dst), labels, reduction="none")
    weight = train_mask.to(per_vertex.dtype)
    return (per_vertex * weight).sum() / weight.sum()


def indexed_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the training vertices, selected with the boolean mask."""
    x, src, dst, labels, train_mask = batch
    out = model(x, src, dst)
    return F.cross_entropy(out[train_mask], labels[train_mask])
