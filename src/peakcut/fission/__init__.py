"""Fission (MAGIS §4-5.1): the F-Tree of candidate sub-graphs, Algorithm 1, and the mutation rules.

- ftree.py: the F-Tree (FNode, FTree) and its four mutation rules;
- analyzer.py: Algorithm 1 (dominators, heat Eq. 3, score Eq. 4, L score intervals).
"""

from peakcut.fission.analyzer import ComponentView, MemoryView, build_ftree, compute_scores
from peakcut.fission.ftree import FNode, FTree, FTreeError, divisors

__all__ = ["ComponentView", "FNode", "FTree", "FTreeError", "MemoryView", "build_ftree",
           "compute_scores", "divisors"]
