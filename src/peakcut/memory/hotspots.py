"""Hot-spots: the storages live at a point of a memory curve, with their bytes and origin.

One builder for every simulator: the step simulation (peakcut.memory.step) and the timed
memory curve (peakcut.simulate.memory) list the storages live at their peak, and
`hotspots` describes them (largest first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from peakcut.ir.graph import Graph


@dataclass(frozen=True)
class PeakStorage:
    """A storage live at the peak."""

    storage: int
    bytes: int
    tensor: str            # name of the tensor that allocated it
    module: str            # module that produced it ('' for caller-held)
    role: str
    phase: str = ""        # phase of the producing node ('' for caller-held)
    node: int | None = None  # the node that produced it (None for caller-held)


def input_owners(g: Graph) -> dict[int, int]:
    """Storage id -> the first program input tensor living in it (caller-held storages)."""
    owner: dict[int, int] = {}
    tensors = g.tensors
    for t in g.inputs:
        owner.setdefault(tensors[t].storage, t)
    return owner


def hotspots(g: Graph, live: Iterable[int], allocated: Mapping[int, tuple[int, int]]) -> tuple[PeakStorage, ...]:
    """The storages `live`, largest first (ties keep the order of `live`).

    allocated: storage id -> (tensor that allocated it, node that produced that tensor) for
    the storages the step allocates; a live storage not in it is caller-held, and named
    after the first program input in it.
    """
    held_owner: dict[int, int] | None = None
    tensors = g.tensors
    nodes = g.nodes
    sizes = g.storages
    spots = []
    for s in live:
        made = allocated.get(s)
        if made is not None:
            meta = tensors[made[0]]
            producer = nodes[made[1]]
            # Enum._value_ is what .value returns, without the descriptor's cost
            spots.append(PeakStorage(storage=s, bytes=sizes[s], tensor=meta.name, module=producer.module,
                                 role=meta.role._value_, phase=producer.phase._value_, node=made[1]))
            continue
        if held_owner is None:
            held_owner = input_owners(g)
        t = held_owner.get(s)
        if t is None:
            spots.append(PeakStorage(storage=s, bytes=sizes[s], tensor=str(s), module="", role=""))
        else:
            meta = tensors[t]
            spots.append(PeakStorage(storage=s, bytes=sizes[s], tensor=meta.name, module="",
                                 role=meta.role._value_, phase=""))
    spots.sort(key=lambda h: -h.bytes)
    return tuple(spots)
