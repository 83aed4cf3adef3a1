"""The IR: tensors, nodes, graphs, the op registry, validation and serialization."""

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
