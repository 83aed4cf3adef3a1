"""The physical floors of a training step on a device with a host link: no plan can go below.

    floors = step_floors(g, get_profile("h100"))
    floors.memory_bytes, floors.compute_seconds, floors.latency_at_memory_floor_seconds

**Memory floor**: the largest working set of one op (its inputs, its new outputs and its
workspace) with everything else in host memory. Every plan runs every op of the step at least
once, so its device peak is at least this. Bytes are the tensors' own (a view counts only the
elements it reaches, at most its storage), so the floor is a lower bound, not an estimate.

**Compute floor**: every op at the profile's peak rate, nothing else: the sum over the step's
ops of max(FLOPs / peak rate, bytes / memory bandwidth) (roofline, no launch overhead, no
ramp; views are free). Re-computation and fission only add to it.

**Latency floor at the memory floor**: at the memory floor the model state (parameters,
optimizer state) cannot stay on the device, so it crosses the host link every step, in one of
two ways, and the floor is the cheaper one:

* the update on the device: parameters and optimizer state come in (h2d) and go back (d2h);
  the copy time is max(h2d bytes / h2d bandwidth, d2h bytes / d2h bandwidth) (the two
  directions run at once);
* the update on the host (ZeRO-Offload's way): the parameters come in for the forward and
  backward, the gradients go out, and the optimizer's ops run on the host, priced on the
  analytic host profile (``host_threads`` cores of the profile ``cpu``).

Either runs beside the device's compute, so the floor is the larger of the compute floor and
that way's copy (and host) time. Activations are left out (re-computing or swapping them only
adds), so the floor stays a lower bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from peakcut.cost.calls import NodeWork, node_work
from peakcut.cost.profiles import HOST_THREADS, DeviceProfile, get_profile
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.ops import is_host_copy
from peakcut.ir.registry import OpKind
from peakcut.ir.tensor import Role
from peakcut.memory.workspace import WorkspaceSpec, order_workspace

DEFAULT_HOST_THREADS = HOST_THREADS
"""Host cores priced for a host update (peakcut.cost.profiles.HOST_THREADS)."""

_TENSOR_CORE_KINDS = (OpKind.MATMUL, OpKind.CONV)


@dataclass(frozen=True)
class Floors:
    """The floors of one step on one device profile (module docstring)."""

    device: str
    memory_bytes: int                      # largest working set of one op
    memory_op: str                         # the op that has it
    compute_seconds: float                 # every op at peak rate
    state_bytes: int                       # parameters + optimizer state
    device_update_copy_seconds: float      # state in and out over the link
    host_update_seconds: float             # params in, grads out, the update on the host
    latency_at_memory_floor_seconds: float
    host_threads: int

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "method": "simulated lower bounds (analytic profile "
                f"{self.device!r}, host {self.host_threads} cores of the analytic cpu profile)"}

    def overhead(self, latency_seconds: float) -> float:
        """A plan's latency over the compute floor, as a fraction (0.25: 25% slower)."""
        return latency_seconds / self.compute_seconds - 1 if self.compute_seconds > 0 else 0.0


def working_set_bytes(g: Graph, nid: int, leave_out: frozenset[int] = frozenset()) -> int:
    """Device bytes node `nid` reads and writes: the elements of its inputs and outputs (a
    storage counted once, at most its size; host storages and the storages in `leave_out`
    not at all), workspace aside."""
    node = g.nodes[nid]
    per_storage: dict[int, int] = {}
    for t in (*node.input_ids(), *node.output_ids()):
        meta = g.tensors[t]
        if g.is_host_storage(meta.storage) or meta.storage in leave_out:
            continue
        per_storage[meta.storage] = per_storage.get(meta.storage, 0) + meta.nbytes
    own = sum(min(b, g.storages[s]) for s, b in per_storage.items())
    return own


@dataclass(frozen=True)
class WorkingSet:
    """The largest working set of one op: its bytes (scratch included), of which scratch, and
    the node (None for a step with no op on the device)."""

    bytes: int
    scratch_bytes: int
    node: int | None


def largest_working_set(g: Graph, workspace: WorkspaceSpec = "auto",
                        leave_out: frozenset[int] = frozenset()) -> WorkingSet:
    """The op of `g` (capture order, host copies aside) whose inputs, outputs (storages in
    `leave_out` not counted, working_set_bytes) and scratch are the most bytes at once."""
    best = WorkingSet(0, 0, None)
    scratch = order_workspace(g, g.order, workspace).tolist()
    for nid, node_scratch in zip(g.order, scratch, strict=True):
        if is_host_copy(g.nodes[nid].op):
            continue
        need = working_set_bytes(g, nid, leave_out) + int(node_scratch)
        if need > best.bytes:
            best = WorkingSet(need, int(node_scratch), nid)
    return best


def roofline_seconds(work: NodeWork, profile: DeviceProfile, tf32: bool = False) -> float:
    """Time of `work` at the profile's peak rate and bandwidth (no launch, no ramp)."""
    if work.kind is OpKind.VIEW:
        return 0.0
    if work.kind in _TENSOR_CORE_KINDS:
        rate = profile.matmul_rate(work.dtype, tf32)
    else:
        rate = profile.vector_rate(work.dtype)
    return max(work.flops / rate, work.bytes / profile.memory_bandwidth)


def _state_bytes(g: Graph, role: Role) -> int:
    return sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is role)


def step_floors(g: Graph, profile: DeviceProfile, *, workspace: WorkspaceSpec = "auto",
                host_threads: int = DEFAULT_HOST_THREADS, tf32: bool = False) -> Floors:
    """The floors of step `g` on `profile` (module docstring)."""
    if host_threads < 1:
        raise ValueError(f"host_threads must be >= 1, got {host_threads}")
    host = get_profile("cpu", cpu_threads=host_threads)
    largest = largest_working_set(g, workspace)
    compute = 0.0
    update_on_host = 0.0
    for nid in g.order:
        node = g.nodes[nid]
        if is_host_copy(node.op):
            continue
        work = node_work(g, nid)
        compute += roofline_seconds(work, profile, tf32)
        if node.phase is Phase.OPTIMIZER:
            update_on_host += roofline_seconds(work, host)
    params = _state_bytes(g, Role.PARAM)
    state = _state_bytes(g, Role.OPT_STATE)
    grads = sum(m.nbytes for m in g.tensors.values() if m.role is Role.GRAD)
    device_way = max((params + state) / profile.h2d_bandwidth, (params + state) / profile.d2h_bandwidth)
    host_way = max(params / profile.h2d_bandwidth, grads / profile.d2h_bandwidth, update_on_host)
    return Floors(
        device=profile.name,
        memory_bytes=largest.bytes,
        memory_op="" if largest.node is None else g.nodes[largest.node].name or g.nodes[largest.node].op,
        compute_seconds=compute,
        state_bytes=params + state,
        device_update_copy_seconds=device_way,
        host_update_seconds=host_way,
        latency_at_memory_floor_seconds=max(compute, min(device_way, host_way)),
        host_threads=host_threads,
    )
