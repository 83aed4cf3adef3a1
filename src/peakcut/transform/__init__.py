"""Graph transformations: scheduling-based rules (remat / de-remat, swap / de-swap) and the
hot-spot candidates they are tried at. Every rule is a pure function (Graph, order, ...) ->
Rewrite with a why_not_* twin that says why it does not apply (None when it does)."""

from peakcut.transform.candidates import Candidate, hotspot_candidates
from peakcut.transform.remat import deremat, remat, why_not_deremat, why_not_remat
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.swap import deswap, swap, why_not_deswap, why_not_swap

__all__ = [
    "Candidate", "Rewrite", "RuleError", "deremat", "deswap", "hotspot_candidates", "remat",
    "swap", "why_not_deremat", "why_not_deswap", "why_not_remat", "why_not_swap",
]
