"""The IR: tensors, nodes, graphs, the op registry, validation and serialization.

- tensor.py: tensor metadata (shape, dtype, storage); node.py: one op call; graph.py: the Graph;
  real_tensors.py: real tensors of a recorded layout, filled cheaply (timing and probing calls);
- edit.py: the one graph editor; infer.py: an op call's output layouts from FakeTensors;
- registry.py: per-op facts; ops.py: peakcut's own ops (device/host copies); guards.py: the
  guard of a data-dependent size specialised at capture (nonzero_counted); sparse_ops.py: a
  sparse matrix's product with a dense one over its dense parts (spmm); collectives.py:
  torch.distributed's collectives as ops (a bucket's all-reduce, its wait); real_dtypes.py:
  where fake kernels disagree with real ones;
- tags.py: what a node carries between packages; foreach.py: the tag of a node that is one
  tensor's share of a list op (torch.optim's foreach and fused updates); node_cache.py:
  values computed for nodes, kept with their keys;
- check.py: validation (check_graph); serialize.py: versioned JSON;
- dims/: dimension rules, for fission."""

from peakcut.ir import collectives  # noqa: F401  (registers the collective ops)
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph, GraphError, StepSignature
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.registry import REGISTRY, OpInfo, OpKind, is_opaque, lookup
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.ir.tensor import Role, TensorMeta

__all__ = [
    "REGISTRY", "Graph", "GraphError", "Node", "OpInfo", "OpKind", "Phase", "Role",
    "StepSignature", "TensorMeta", "TensorRef", "check_graph", "graph_from_json", "graph_to_json",
    "is_opaque", "lookup",
]
