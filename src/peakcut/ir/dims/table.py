"""The op -> rule table and dim_rule(g, nid): the dimension rule of one node.

A rule is a pure function of the node (op, arguments, which inputs it writes in
place) and of the metadata of the tensors it reads and writes (their shapes and
dtypes: all that Call.of takes from the graph). dim_rule keeps the last rule it
built for a node object in a NodeCache, with the TensorMeta objects it read, and
reuses it while the graph still holds equal metas for those tensors: graphs derived
by editing (e.g. TASO rewrites) share Node objects, so their unchanged nodes cost
one tuple comparison each.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from peakcut.ir.dims import linalg, movement, norms, pointwise, reductions, views
from peakcut.ir.dims.call import Builder, Call, assemble, aten
from peakcut.ir.dims.rule import DimRule
from peakcut.ir.graph import Graph
from peakcut.ir.guards import NONZERO_COUNTED_OP
from peakcut.ir.node_cache import NodeCache
from peakcut.ir.ops import GATE_OP, LOAD_OP, STORE_OP, UPLOAD_OP, WRITEBACK_OP
from peakcut.ir.registry import REGISTRY
from peakcut.ir.sparse_ops import SPMM_OP

BUILDERS: Mapping[str, Builder] = MappingProxyType({
    **views.BUILDERS, **pointwise.BUILDERS, **reductions.BUILDERS, **linalg.BUILDERS,
    **norms.BUILDERS, **movement.BUILDERS,
})
"""Every op with a dimension rule (a builder that may still decline for some calls)."""

_RANDOM = "draws random numbers: never split or duplicated (docs/design.md: randomness)"

NO_RULE: Mapping[str, str] = MappingProxyType({
    aten("as_strided"): "arbitrary sizes and strides: output axes need not match input axes",
    aten("_foreach_add_.List"): "updates a list in place: a split along one tensor's axis would "
                                "apply the update to every other tensor n times",
    aten("_foreach_mul_.Scalar"): "updates a list in place (as _foreach_add_.List)",
    aten("addmm_"): "a fission part adding its product into a summed output (fission/accumulate.py): "
                    "made after every split, never split itself",
    STORE_OP: "swap-out: code generation emits the copy itself; never split",
    LOAD_OP: "swap-in: code generation emits the copy itself; never split",
    WRITEBACK_OP: "copy into a host tensor: code generation emits the copy itself; never split",
    UPLOAD_OP: "copy into a device tensor from host memory: code generation emits the copy itself; "
               "never split",
    GATE_OP: "the GradScaler's skip-the-update decision: code generation emits it as an early return",
    SPMM_OP: "a sparse matrix's product over its index tensors and values: never split",
    NONZERO_COUNTED_OP: "a data-dependent size's guard (nonzero checked against the count capture saw): "
                        "a part would see another count",
    **{name: _RANDOM for name, info in REGISTRY.items() if info.random},   # the registry's list
})
"""Registry ops without a dimension rule, and why (dim_rule returns None for them)."""


_RULES: NodeCache[tuple[DimRule | None]] = NodeCache()
"""node -> (its rule,), depending on the metas of the node's inputs and outputs."""


def dim_rule(g: Graph, nid: int) -> DimRule | None:
    """The dimension rule of node `nid`; None when the node is never split.

    None for ops without a rule (NO_RULE, opaque ops) and for calls a builder
    declines (e.g. boolean-mask indexing, attention with dropout). A rule may
    have no labels at all (e.g. arange): known, but nothing to split.
    Cached per node object while its tensors' metas stay equal (module doc).
    """
    node = g.nodes[nid]
    builder = BUILDERS.get(node.op)
    if builder is None:
        return None
    tensors = g.tensors
    metas = tuple([tensors[t] for t in node.input_tuple] + [tensors[t] for t in node.output_tuple])
    cached = _RULES.get(node, metas)
    if cached is not None:
        return cached[0]
    rule = build_rule(g, nid)
    _RULES.put(node, (rule,), metas)
    return rule


def build_rule(g: Graph, nid: int) -> DimRule | None:
    """dim_rule(g, nid) built afresh, without the cache."""
    node = g.nodes[nid]
    builder = BUILDERS.get(node.op)
    if builder is None:
        return None
    call = Call.of(g, nid)
    labeling = builder(call)
    if labeling is None:
        return None
    return assemble(call, node.input_ids(), g.mutated_tensors(nid), labeling)
