"""Graph transformations: the bodies of the scheduling-based rules (remat / de-remat, swap /
de-swap) and what every rule shares (Rewrite, RuleError). Every rule is a pure function
(Graph, order, ...) -> Rewrite with a why_not_* twin that says why it does not apply (None
when it does). Where the search tries them, and their placement and codegen hooks: the rule
registry, peakcut.rules."""

from peakcut.transform.remat import deremat, remat, why_not_deremat, why_not_remat
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.swap import deswap, swap, why_not_deswap, why_not_swap

__all__ = [
    "Rewrite", "RuleError", "deremat", "deswap", "remat", "swap", "why_not_deremat", "why_not_deswap",
    "why_not_remat", "why_not_swap",
]
