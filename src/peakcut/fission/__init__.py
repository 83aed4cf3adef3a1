"""Fission (MAGIS §4-5.1): split sub-graphs along a dimension and run the parts one by one.

- dgraph.py: the D-Graph (dimension rules of peakcut.ir.dims joined across edges);
- trans.py: F-Trans validity (the paper's conditions plus what exact code needs);
- ftree.py: the F-Tree (FNode, FTree) and its four mutation rules;
- analyzer.py: Algorithm 1 (dominators, heat Eq. 3, score Eq. 4, L score intervals);
- build.py: Algorithm 1 on a captured step (hot-spots from the simulation), and the
  batch dimension's components (cut by training-mode batch norms);
- bound.py: the peak no exact batch fission goes below;
- expand.py: the plain graph that runs what the fission loops run (memory, latency, codegen).
"""

from peakcut.fission.analyzer import ComponentView, MemoryView, build_ftree, compute_scores
from peakcut.fission.bound import FissionBound, batch_fission_bound
from peakcut.fission.build import analyze, batch_components, best_root_at_two
from peakcut.fission.dgraph import DGraph, build_dgraph
from peakcut.fission.expand import Expanded, FissionError, expand
from peakcut.fission.ftree import FNode, FTree, FTreeError, divisors

__all__ = ["ComponentView", "DGraph", "Expanded", "FNode", "FTree", "FTreeError", "FissionBound",
           "FissionError", "MemoryView", "analyze", "batch_components", "batch_fission_bound", "best_root_at_two",
           "build_dgraph", "build_ftree", "compute_scores", "divisors", "expand"]
