"""Synthetic graphs of the shape of ROC's datasets (Jia's thesis, Table 4.4), for the GNN workloads.

A graph is an edge list grouped by destination vertex (``dst`` sorted, then ``src``), as ROC
and CSR-based kernels keep it, with vertex features, class labels and a boolean training mask:

==========  ==========  ============  ========  =======
dataset     vertices    edges         features  classes
==========  ==========  ============  ========  =======
Reddit         232,965   114,848,857       602       41
Amazon       9,430,088   231,594,310       300       24
==========  ==========  ============  ========  =======

Degrees follow a power law: each edge's endpoints are drawn with probability proportional to
``rank ** -alpha`` over a random ranking of the vertices (``alpha`` 0.8 for destinations, 0.5
for sources), so a few vertices have thousands of neighbours and most have few, as in the
real graphs. Values depend only on the seed (torch's CPU generator, isolated from the
caller's). Self-loops are not stored; a model adds them where its layer does (GCN).

On the ``meta`` device (paper size) only the shapes exist: nothing is drawn or allocated,
so a 115M-edge graph costs nothing until it is captured over FakeTensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GraphShape:
    """How big a graph is: vertices, edges, feature width, classes, training fraction."""

    vertices: int
    edges: int
    features: int
    classes: int
    train_fraction: float = 0.66

    def __post_init__(self) -> None:
        for name in ("vertices", "edges", "features", "classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"GraphShape.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError(f"GraphShape.train_fraction must be in (0, 1], got {self.train_fraction}")

    @property
    def average_degree(self) -> float:
        """Edges per vertex."""
        return self.edges / self.vertices


REDDIT = GraphShape(vertices=232_965, edges=114_848_857, features=602, classes=41)
AMAZON = GraphShape(vertices=9_430_088, edges=231_594_310, features=300, classes=24)
PAPER_SHAPES: dict[str, GraphShape] = {"reddit": REDDIT, "amazon": AMAZON}


@dataclass(frozen=True)
class GraphBatch:
    """A graph as one full-graph training batch: features [V, F], edge sources and
    destinations [E] (int64, grouped by destination), labels [V] (int64), train_mask [V] (bool)."""

    x: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    labels: torch.Tensor
    train_mask: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """(x, src, dst, labels, train_mask): the order the GNN workloads' batches have."""
        return (self.x, self.src, self.dst, self.labels, self.train_mask)


def _power_law_ends(vertices: int, edges: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """`edges` vertex ids drawn with probability ~ rank ** -alpha over a random ranking."""
    weights = torch.arange(1, vertices + 1, dtype=torch.float64).pow(-alpha)
    ranks = torch.multinomial(weights, edges, replacement=True, generator=gen)
    return torch.randperm(vertices, generator=gen)[ranks]


def synthetic_graph(shape: GraphShape, seed: int = 0, device: str | torch.device | None = None) -> GraphBatch:
    """A power-law graph of `shape` (module docstring), deterministic in `seed`.

    `device` defaults to the ambient default device; on ``meta`` only shapes are made.
    """
    dev = torch.empty(0, device=device).device
    v, e = shape.vertices, shape.edges
    if dev.type == "meta":
        return GraphBatch(
            x=torch.empty(v, shape.features, device=dev),
            src=torch.empty(e, dtype=torch.int64, device=dev),
            dst=torch.empty(e, dtype=torch.int64, device=dev),
            labels=torch.empty(v, dtype=torch.int64, device=dev),
            train_mask=torch.empty(v, dtype=torch.bool, device=dev),
        )
    gen = torch.Generator().manual_seed(seed)
    dst = _power_law_ends(v, e, 0.8, gen)
    src = _power_law_ends(v, e, 0.5, gen)
    loops = src == dst                       # self-loops move to the next vertex
    src = torch.where(loops, (src + 1) % v, src)
    order = torch.argsort(dst * v + src, stable=True)
    x = torch.randn(v, shape.features, generator=gen)
    labels = torch.randint(0, shape.classes, (v,), generator=gen)
    train_mask = torch.rand(v, generator=gen) < shape.train_fraction
    return GraphBatch(x=x.to(dev), src=src[order].to(dev), dst=dst[order].to(dev), labels=labels.to(dev),
                      train_mask=train_mask.to(dev))
