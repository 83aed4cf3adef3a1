"""A memory limit that no plan can meet on a host device: below what the step holds.

    refused = held_floor_refusal(g, memory_limit=0.5, device_name="measured:cpu")   # None or why
    whole = whole_op_floor(g, memory_limit=0.5, device_name="measured:cpu")        # None or why
    refused.text, refused.as_dict()

On a CPU cost model (HOST_DEVICES) the rules that free memory by a copy to host memory are
left out of the search: the host is the device, so a copy frees nothing. The parameters,
buffers, optimizer state and batch (the caller-held storages, the simulated baseline) then
stay in device memory for the whole step, and their bytes are a floor under every plan's
peak. A memory limit below that floor is refused at once, with the figures, instead of after
a search and a verification that cannot succeed.

On every other device the floor is not a floor (offload moves parameters and optimizer state
to host memory), and nothing is refused here.

A second floor is not a refusal, only a reason: every op run whole, as captured, needs its
inputs, its outputs and its scratch at once, beside what the step holds. When the limit is
below that for some op, only a plan that splits the op (a fission region around it,
`split_rows`) or rewrites it (a rewrite rule) can meet the limit, and LimitNotMet says
which op and by how much. Medium U-Net on the development CPU at memory_limit=0.5: the
first convolution backward of the last decoder block reads a 48 MiB concatenation and a
24 MiB gradient and writes a 48 MiB gradient, with 72 MiB of scratch, beside 357 MiB held:
550 MiB against a 451 MiB limit (simulated). Where the search's root was rewritten
(optimizer.root_rewrites) its plans have the root's floor, when lower: split_conv_cat runs that
backward once per concatenated tensor, 120 MiB each with 48 MiB of scratch, so 478 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.memory.step import simulate
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.optimizer.floors import largest_working_set
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
                       workspace: WorkspaceSpec = "auto") -> HeldFloor | None:
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


@dataclass(frozen=True)
class WholeOpFloor:
    """The least peak of a plan that runs every op whole on a host device (module doc): what
    the step holds plus the largest op's own inputs, outputs and scratch (simulated bytes)."""

    limit_bytes: int
    held_bytes: int
    op_bytes: int          # the op's inputs, outputs and scratch outside the held storages
    scratch_bytes: int     # of which scratch
    op: str
    text: str

    @property
    def floor_bytes(self) -> int:
        return self.held_bytes + self.op_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes, "held_bytes": self.held_bytes, "op_bytes": self.op_bytes,
                "scratch_bytes": self.scratch_bytes, "op": self.op, "floor_bytes": self.floor_bytes,
                "text": self.text}


def whole_op_floor(g: Graph, memory_limit: float | int | str | None, device_name: str,
                   workspace: WorkspaceSpec = "auto", as_run: str = "as captured") -> WholeOpFloor | None:
    """Why no plan that runs every op of `g` whole can meet `memory_limit` on `device_name`
    (module doc), or None when one may (or the device is not the host). as_run: what g is, for
    the sentence (the captured step, or the search's root after its rewrites)."""
    if memory_limit is None or device_name not in HOST_DEVICES:
        return None
    eager = simulate(g, g.order, workspace)
    limit = parse_memory_limit(memory_limit, eager.peak_bytes)
    held = eager.baseline_bytes
    largest = largest_working_set(g, workspace, frozenset(g.tensors[t].storage for t in g.inputs))
    if largest.node is None or held + largest.bytes <= limit:
        return None
    node = g.nodes[largest.node]
    op = node.op.removeprefix("aten.").removesuffix(".default")
    name = f"{op} of module {node.module!r}" if node.module else op
    text = (f"run whole, {as_run}, {name} needs {format_bytes(largest.bytes)} at once (its inputs, outputs "
            f"and {format_bytes(largest.scratch_bytes)} of scratch) beside the {format_bytes(held)} the step "
            f"holds: {format_bytes(held + largest.bytes)} against the limit {format_bytes(limit)} (simulated); a "
            "plan must split or rewrite that op (a fission region around it, split_rows, a rewrite rule) to meet "
            "the limit")
    return WholeOpFloor(limit, held, largest.bytes, largest.scratch_bytes, name, text)


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
