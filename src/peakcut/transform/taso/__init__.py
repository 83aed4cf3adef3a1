"""TASO-style graph rewrites (MAGIS §5 "TASO rules": aggregation A-Trans and interim I-Trans)
for the optimizer search: merging matmuls that share an operand (or whose results are summed)
and its inverse, plus the algebraic simplifications that fire on the captured workloads, and
the convolution rewrites. Every rule is a pure function (Graph, order, ...) -> Rewrite with a
why_not_* twin (the rule registry, peakcut.rules, interleaves their sites).

- edit.py: the editor every TASO-style rewrite makes its nodes with; tag.py: their tag (TasoTag);
- find.py: the applicable sites of merge_matmuls, split_matmul and the one-node rules;
- matmul.py: reading a matmul's operands; matmul_merge.py, matmul_split.py: merging matmuls
  and splitting (or un-merging) one;
- algebra.py: drop_identity, cancel_transposes, fold_views;
- conv_cat.py: split_conv_cat, convolutions run per concatenated tensor;
- conv_grads.py: split_conv_grads, a convolution's backward as two calls;
- substitute.py: substitute, a node's result computed instead by given ATen calls (a generated
  substitution's destination, peakcut.taso).
"""

from peakcut.transform.taso.algebra import (
    cancel_transposes,
    drop_identity,
    fold_views,
    why_not_cancel_transposes,
    why_not_drop_identity,
    why_not_fold_views,
)
from peakcut.transform.taso.find import merge_groups
from peakcut.transform.taso.matmul_merge import merge_matmuls, why_not_merge_matmuls
from peakcut.transform.taso.matmul_split import split_matmul, why_not_split_matmul

__all__ = [
    "cancel_transposes", "drop_identity", "fold_views", "merge_groups",
    "merge_matmuls", "split_matmul", "why_not_cancel_transposes",
    "why_not_drop_identity", "why_not_fold_views", "why_not_merge_matmuls",
    "why_not_split_matmul",
]
