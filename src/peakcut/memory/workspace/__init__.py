"""Transient workspace: the bytes an op allocates and frees while it runs, beyond its outputs.

    order_workspace(g, order, "cpu")          # per node of an order (the simulators call it)
    cpu_workspace_bytes(op, args, kwargs, outputs, CpuMachine.current())   # one call

Two CPU models (docs/workspace.md). The default ("cpu") is calibrated on the machine at
hand: each distinct call measured once from the allocator's events and cached per machine
fingerprint (measured.py), in a profiler session that prints nothing (profiler.py). The
analytic rules ("cpu-rules"; oneDNN / ATen CPU kernels, fitted to one AVX-512 CPU) answer where nothing can be measured; they are split by op
family: pointwise, reductions, norms, indexing, matmul, convolution (with conv_geometry,
onednn and onednn_wgrad), and rules.py maps families to rules. On a GPU ("cuda") each
distinct call is measured with torch.cuda's allocator statistics (cuda.py). Everything a rule reads of
the machine is a CpuMachine (machine.py); each model's key keys every cache (nodes.py).
"""

from peakcut.memory.workspace.cuda import CalibratedCudaWorkspace, measure_cuda_calls
from peakcut.memory.workspace.machine import CpuMachine, OneDnnFit
from peakcut.memory.workspace.measured import CalibratedCpuWorkspace, measure_calls
from peakcut.memory.workspace.nodes import (
    WORKSPACE_MODELS,
    CpuWorkspace,
    WorkspaceModel,
    WorkspaceSpec,
    describe_workspace,
    model_name,
    node_workspace,
    order_workspace,
    workspace_model,
)
from peakcut.memory.workspace.rules import cpu_workspace_bytes, workspace_ops

__all__ = [
    "WORKSPACE_MODELS", "CalibratedCpuWorkspace", "CalibratedCudaWorkspace", "CpuMachine", "CpuWorkspace",
    "OneDnnFit",
    "WorkspaceModel", "WorkspaceSpec", "cpu_workspace_bytes", "describe_workspace", "measure_calls",
    "measure_cuda_calls", "model_name", "node_workspace", "order_workspace", "workspace_model", "workspace_ops",
]
