"""A memory limit that no plan can meet on a host device: below what the step holds.

    refused = held_floor_refusal(g, memory_limit=0.5, device_name="measured:cpu")   # None or why
    refused.text, refused.as_dict()

On a CPU cost model (HOST_DEVICES) the rules that free memory by a copy to host memory are
left out of the search: the host is the device, so a copy frees nothing. The parameters,
buffers, optimizer state and batch (the caller-held storages, the simulated baseline) then
stay in device memory for the whole step, and their bytes are a floor under every plan's
peak. A memory limit below that floor is refused at once, with the figures, instead of after
a search and a verification that cannot succeed.

On every other device the floor is not a floor (offload moves parameters and optimizer state
to host memory), and nothing is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.memory.step import simulate
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.optimizer.objective import parse_memory_limit
from peakcut.units import format_bytes

HOST_DEVICES = ("measured:cpu", "analytic:cpu")
"""Cost models whose device is the host: a copy to host memory frees nothing there."""

_HELD_ROLES = ((Role.PARAM, "parameters"), (Role.BUFFER, "buffers"), (Role.OPT_STATE, "optimizer state"),
               (Role.INPUT, "batch"), (Role.ACCUMULATED, "accumulated gradients"))


@dataclass(frozen=True)
class HeldFloor:
    """A refused memory limit: the limit, the bytes held between steps, eager's peak (all
    simulated bytes) and the sentence that says why."""

    limit_bytes: int
    held_bytes: int
    eager_peak_bytes: int
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes, "held_bytes": self.held_bytes,
                "eager_peak_bytes": self.eager_peak_bytes, "text": self.text}


def held_floor_refusal(g: Graph, memory_limit: float | int | str | None, device_name: str,
                       workspace: WorkspaceSpec = "cpu") -> HeldFloor | None:
    """Why `memory_limit` cannot be met on `device_name` (module doc), or None when it may be.
    The limit is read as peakcut.optimize reads it (a fraction of the eager peak, simulated)."""
    if memory_limit is None or device_name not in HOST_DEVICES:
        return None
    eager = simulate(g, g.order, workspace)
    limit = parse_memory_limit(memory_limit, eager.peak_bytes)
    held = eager.baseline_bytes
    if limit >= held:
        return None
    text = (f"the limit {format_bytes(limit)} is below the {format_bytes(held)} the step holds between steps "
            f"({held_parts(g)}; eager's peak {format_bytes(eager.peak_bytes)}, simulated): on {device_name} the "
            "host is the device, so no plan can move them out and none goes below them")
    return HeldFloor(limit, held, eager.peak_bytes, text)


def held_parts(g: Graph) -> str:
    """The caller-held bytes by role, e.g. "parameters 418 MiB, optimizer state 836 MiB"."""
    sizes = g.storages
    inputs = set(g.inputs)
    parts = []
    for role, name in _HELD_ROLES:
        size = sum(sizes[s] for s in {t.storage for t in g.tensors_with_role(role) if t.id in inputs})
        if size:
            parts.append(f"{name} {format_bytes(size)}")
    return ", ".join(parts)
