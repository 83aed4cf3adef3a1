"""TASO-style graph rewrites (MAGIS §5 "TASO rules": aggregation A-Trans and interim I-Trans)
for the optimizer search: merging matmuls that share an operand (or whose results are summed)
and its inverse, plus the algebraic simplifications that fire on the captured workloads. Every
rule is a pure function (Graph, order, ...) -> Rewrite with a why_not_* twin; find.py finds
the applicable sites of each (the rule registry, peakcut.rules, interleaves them)."""

from peakcut.transform.taso.algebra import (
    cancel_transposes,
    drop_identity,
    fold_views,
    why_not_cancel_transposes,
    why_not_drop_identity,
    why_not_fold_views,
)
from peakcut.transform.taso.find import TasoCandidate, merge_groups
from peakcut.transform.taso.matmul_merge import merge_matmuls, why_not_merge_matmuls
from peakcut.transform.taso.matmul_split import split_matmul, why_not_split_matmul

__all__ = [
    "TasoCandidate", "cancel_transposes", "drop_identity", "fold_views", "merge_groups",
    "merge_matmuls", "split_matmul", "why_not_cancel_transposes",
    "why_not_drop_identity", "why_not_fold_views", "why_not_merge_matmuls",
    "why_not_split_matmul",
]
