"""Dimension rules: how each op's tensors line up along named axes, for fission.

    rule = dim_rule(g, nid)             # DimRule, or None: never split
    call = split_node_args(g, nid, rule, label, n, part)   # PartCall: narrows + args
    merged = merge_outputs(rule, label, [call_p.run(tensors) for call_p in ...])

Layout: rule.py (DimRule, merge kinds), call.py (what builders see and the
generic checks), one module per op family (views, pointwise, reductions,
linalg, norms, movement), shapes.py (labelling, broadcasting, reshape
alignment shared by the builders), table.py (op -> builder, ops without a rule,
dim_rule), split.py (running a node in parts and merging the results).
"""

from peakcut.ir.dims.rule import CAT, MERGE_KINDS, SAME, DimRule, Dims, Label
from peakcut.ir.dims.split import (
    Narrow,
    PartCall,
    as_outputs,
    can_split,
    label_sizes,
    merge_outputs,
    part_rule,
    split_node_args,
)
from peakcut.ir.dims.table import BUILDERS, NO_RULE, dim_rule

__all__ = [
    "BUILDERS", "CAT", "MERGE_KINDS", "NO_RULE", "SAME", "DimRule", "Dims", "Label", "Narrow",
    "PartCall", "as_outputs", "can_split", "dim_rule", "label_sizes", "merge_outputs", "part_rule",
    "split_node_args",
]
