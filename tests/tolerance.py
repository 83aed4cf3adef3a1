"""Float tolerances derived from dtype and reduction length, not tuned to one machine.

Two computations of the same value that differ only in rounding (another summation
order, another kernel, a split reduction) differ by about u * sqrt(K) relative for a
reduction of length K (u = the unit roundoff, eps / 2), and errors that are carried
through `steps` optimizer steps add up at most linearly. A safety factor covers the constant in
front (blocked sums, a few chained ops per value). A step that runs the very same
kernels in the same order is exact on any machine; the bound is what a plan that
re-orders or splits reductions may differ by.
"""

from __future__ import annotations

import torch

from peakcut.runtime.equivalence import rounding_tolerance


def tolerance(dtype: torch.dtype, reduction: int, steps: int = 1) -> float:
    """rtol (and atol, for values of order one) for `dtype` after reductions of length
    `reduction`, carried through `steps` steps."""
    return rounding_tolerance(dtype, reduction, steps)
