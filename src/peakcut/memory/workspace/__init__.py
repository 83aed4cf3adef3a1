"""Transient workspace: the bytes an op allocates and frees while it runs, beyond its outputs.

    order_workspace(g, order, "cpu")          # per node of an order (the simulators call it)
    cpu_workspace_bytes(op, args, kwargs, outputs, CpuMachine.current())   # one call

One CPU model (oneDNN / ATen CPU kernels, measured; docs/workspace.md), split by op
family: pointwise, reductions, norms, indexing, matmul, convolution (with conv_geometry,
onednn and onednn_wgrad); rules.py maps families to rules. Everything a rule reads of the
machine is a CpuMachine (machine.py), the seam a per-machine calibration plugs into, and
the key of every cache (nodes.py).
"""

from peakcut.memory.workspace.machine import CpuMachine, OneDnnFit
from peakcut.memory.workspace.nodes import (
    WORKSPACE_MODELS,
    CpuWorkspace,
    WorkspaceSpec,
    node_workspace,
    order_workspace,
    workspace_model,
)
from peakcut.memory.workspace.rules import cpu_workspace_bytes, workspace_ops

__all__ = [
    "WORKSPACE_MODELS", "CpuMachine", "CpuWorkspace", "OneDnnFit", "WorkspaceSpec",
    "cpu_workspace_bytes", "node_workspace", "order_workspace", "workspace_model", "workspace_ops",
]
