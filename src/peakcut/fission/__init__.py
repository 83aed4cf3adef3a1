"""Fission (MAGIS §4-5.1): split sub-graphs along a dimension and run the parts one by one.

- dgraph.py: the D-Graph (dimension rules of peakcut.ir.dims joined across edges);
- trans.py: F-Trans validity (the paper's conditions plus what exact code needs);
- ftree.py: the F-Tree (FNode, FTree) and its four mutation rules;
- analyzer.py: Algorithm 1 (dominators, heat Eq. 3, score Eq. 4, L score intervals) on
  component views (ftree_from_components);
- build.py: Algorithm 1 on a captured step (find_ftree: hot-spots from the simulation), and
  the batch dimension's components (cut by training-mode batch norms);
- head.py: the head-and-loss region, a candidate nested under the region that holds it;
- bound.py: the peak no exact batch fission goes below;
- spatial_tree.py: the F-Tree of the rows (Algorithm 1 over what spatial fission splits,
  peakcut.transform.spatial), its roots split with halos;
- loss.py: exact rewrites of the captured loss that let regions span it;
- expand.py: the plain graph that runs what the fission loops run (memory, latency, codegen),
  with expanded.py (its result), region.py (one region into its parts), boundary.py (what a
  region reads and hands out), merge.py (rebuilding its outputs from the parts),
  accumulate.py (summed outputs accumulated by the parts' products) and reuse.py
  (snapshots of expansions that start alike).
"""

from peakcut.fission.analyzer import (
    ComponentView,
    MemoryView,
    compute_scores,
    ftree_from_components,
)
from peakcut.fission.bound import FissionBound, batch_fission_bound
from peakcut.fission.build import batch_components, best_root_at_two, find_ftree
from peakcut.fission.dgraph import DGraph, build_dgraph
from peakcut.fission.expand import expand
from peakcut.fission.expanded import Expanded, FissionError
from peakcut.fission.ftree import FNode, FTree, FTreeError, divisors

__all__ = ["ComponentView", "DGraph", "Expanded", "FNode", "FTree", "FTreeError", "FissionBound",
           "FissionError", "MemoryView", "batch_components", "batch_fission_bound", "best_root_at_two",
           "build_dgraph", "compute_scores", "divisors", "expand", "find_ftree",
           "ftree_from_components"]
