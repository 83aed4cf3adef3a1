"""Links between ranks, and what a collective costs on them.

A link is priced by two figures: `step_seconds`, the latency of one step of a ring (a
message from a rank to its neighbour), and `bus_bandwidth`, the bytes/s each rank moves
per direction once the ring streams (NCCL's "bus bandwidth"). A ring all-reduce of n bytes
over p ranks takes 2(p-1) steps, each moving n/p bytes (reduce-scatter, then all-gather);
a broadcast pipelines n bytes down a chain of p-1 steps. Figures:

- nvlink4: H100/H200 SXM, 18 NVLink 4 links through NVSwitch, 900 GB/s both directions
  (datasheet); NCCL all-reduce reaches about 80% of 450 GB/s per direction: 360 GB/s.
- nvlink3: A100 SXM, 600 GB/s both directions (datasheet): 230 GB/s bus bandwidth.
- pcie4: GPUs without NVLink (RTX 3090), peer copies over PCIe 4.0 x16: 20 GB/s.
- infiniband-ndr: across nodes, one 400 Gb/s NDR adapter per GPU (50 GB/s): 45 GB/s.
- gloo-loopback: gloo on one CPU machine over loopback TCP, measured on a 2-core VM by
  `python -m bench.links` (2 ranks, torch.distributed.all_reduce of 1 KiB to 16 MiB, medians
  of 7, the ring model fitted): 54 us per step and 0.95 GB/s (small all-reduces take about
  0.3 ms there: the fit favours the large buckets that cost a step its time).

An all-gather whose output has n bytes and a reduce-scatter whose input has n bytes take p-1
ring steps of n/p bytes each.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from peakcut.ir.collectives import ALL_GATHER_OP, ALL_REDUCE_OP, BROADCAST_OP, REDUCE_SCATTER_OP

GIGA = 1e9
MICRO = 1e-6


@dataclass(frozen=True)
class LinkProfile:
    """One link between ranks: per-step latency (s) and bus bandwidth (bytes/s)."""

    name: str
    step_seconds: float
    bus_bandwidth: float

    def all_reduce_seconds(self, nbytes: int, ranks: int) -> float:
        """A ring all-reduce of `nbytes` over `ranks` ranks (0 for one rank)."""
        if ranks <= 1:
            return 0.0
        steps = 2 * (ranks - 1)
        return steps * (self.step_seconds + nbytes / ranks / self.bus_bandwidth)

    def broadcast_seconds(self, nbytes: int, ranks: int) -> float:
        """A pipelined chain broadcast of `nbytes` to `ranks` ranks (0 for one rank)."""
        if ranks <= 1:
            return 0.0
        return (ranks - 1) * self.step_seconds + nbytes / self.bus_bandwidth

    def ring_seconds(self, nbytes: int, ranks: int) -> float:
        """An all-gather of `nbytes` in all (each rank contributes nbytes / ranks) or a
        reduce-scatter of `nbytes` per rank: p-1 ring steps of nbytes / p."""
        if ranks <= 1:
            return 0.0
        return (ranks - 1) * (self.step_seconds + nbytes / ranks / self.bus_bandwidth)

    def collective_seconds(self, op: str, nbytes: int, ranks: int) -> float:
        """The collective `op` (the start ops of ir.collectives) whose input has `nbytes`."""
        if op == ALL_REDUCE_OP:
            return self.all_reduce_seconds(nbytes, ranks)
        if op == BROADCAST_OP:
            return self.broadcast_seconds(nbytes, ranks)
        if op == ALL_GATHER_OP:
            return self.ring_seconds(nbytes * ranks, ranks)
        if op == REDUCE_SCATTER_OP:
            return self.ring_seconds(nbytes, ranks)
        raise ValueError(f"op {op!r} is not a collective peakcut prices")


NVLINK4 = LinkProfile("nvlink4", 2 * MICRO, 360 * GIGA)
NVLINK3 = LinkProfile("nvlink3", 3 * MICRO, 230 * GIGA)
PCIE4 = LinkProfile("pcie4", 5 * MICRO, 20 * GIGA)
INFINIBAND_NDR = LinkProfile("infiniband-ndr", 5 * MICRO, 45 * GIGA)
GLOO_LOOPBACK = LinkProfile("gloo-loopback", 54 * MICRO, 0.95 * GIGA)

LINKS = MappingProxyType({link.name: link for link in (NVLINK4, NVLINK3, PCIE4, INFINIBAND_NDR, GLOO_LOOPBACK)})

# the link between the GPUs of one node, per device profile; a CPU's ranks talk over gloo
_NODE_LINK = MappingProxyType({"h100": NVLINK4, "h200": NVLINK4, "a100-80gb": NVLINK3, "rtx3090": PCIE4})


def node_link(profile_name: str) -> LinkProfile:
    """The link between ranks of one node for the device profile named `profile_name`."""
    return _NODE_LINK.get(profile_name, GLOO_LOOPBACK)
