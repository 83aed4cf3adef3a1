"""The IR: tensors, nodes, graphs, the op registry, validation and serialization."""

from peakcut.ir.graph import Graph, GraphError, StepSignature
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.registry import REGISTRY, OpInfo, OpKind, is_opaque, lookup
from peakcut.ir.tensor import Role, TensorMeta

__all__ = [
    "REGISTRY", "Graph", "GraphError", "Node", "OpInfo", "OpKind", "Phase", "Role",
    "StepSignature", "TensorMeta", "TensorRef", "is_opaque", "lookup",
]
