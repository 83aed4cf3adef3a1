"""The analytic cost model: a roofline with a utilization curve, from a DeviceProfile.

latency = launch + max(flops / achieved_flop_rate, bytes / achieved_bandwidth), where an op
with work w (FLOPs for compute, bytes for memory) achieves peak * w / (w + w_half), i.e. its
time is (w + w_half) / peak. Small ops -- like the slices fission produces -- therefore cost
more per FLOP and per byte than large ones. Views cost the profile's view_seconds only; ops
that only allocate (empty*) cost one launch; swap nodes cost launch + bytes / host bandwidth;
nodes on the host (an update moved there) are priced on the host's profile
(profiles.host_profile: the rough CPU profile for 16 cores beside a GPU). A node that is one
tensor's share of a list op of the update (ir.foreach.ForeachTag: torch._foreach_*, a fused
kernel over n tensors) pays launch / n: code generation writes the n shares as one call,
so the call's one launch is spread over them (where a plan splits the run, the split calls
are priced as if still one).
On an asynchronous device (a GPU profile: DeviceProfile.asynchronous) a call's launch (a
view's view_seconds) is the host's work of issuing it (issue_seconds) and the rest its device
time (node_seconds); the timeline overlaps the two (simulate/streams.py). On a CPU
node_seconds is the whole call and issue_seconds 0.
FLOPs and bytes come from peakcut.ir.registry (flops, bytes_moved) on meta tensors.
"""

from __future__ import annotations

from peakcut.cost.calls import NodeWork, call_key, is_swap, node_work, swap_transfer
from peakcut.cost.links import LinkProfile, node_link
from peakcut.cost.profiles import DeviceProfile, host_profile
from peakcut.ir.collectives import STARTS, WAIT_OP, world_size_of
from peakcut.ir.foreach import ForeachTag
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tensor import TensorMeta

ALLOCATION_ONLY_OPS: frozenset[str] = frozenset({
    "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
    "aten.new_empty.default", "aten.new_empty_strided.default",
})
"""Factories that allocate without writing: no bandwidth, one launch."""

_TENSOR_CORE_KINDS = (OpKind.MATMUL, OpKind.CONV)

NODE_MEMO_LIMIT = 1 << 16
"""Entries of a model's per-node memo before it is emptied (bounds the nodes it keeps alive)."""


def ramp_seconds(work: float, peak: float, half: float) -> float:
    """Time of `work` at rate peak * work / (work + half); 0 for no work."""
    if work <= 0:
        return 0.0
    return (work + half) / peak


class AnalyticCostModel:
    """Per-op latency from a DeviceProfile's peak figures (see the module docstring).

    tf32: price fp32 matmuls and convolutions at the TF32 tensor-core rate (what
    torch.backends.cuda.matmul.allow_tf32 enables) instead of the FP32 rate. link: the link
    collectives between ranks run on (cost.links; default: the profile's link within a node).
    """

    def __init__(self, profile: DeviceProfile, *, tf32: bool = False, link: LinkProfile | None = None) -> None:
        self.profile = profile
        self.tf32 = tf32
        self.link = link if link is not None else node_link(profile.name)
        self.name = f"analytic:{profile.name}" if link is None else f"analytic:{profile.name}+{link.name}"
        self.overlap_copies = profile.overlap_copies
        host = host_profile(profile)
        # nodes on the host (NodeTags.on_host): priced on the host's profile
        self.host: AnalyticCostModel = self if host is profile else AnalyticCostModel(host)
        self._seconds: dict[str, float] = {}  # call key -> seconds, for this instance only
        # id(node) -> (node, its input metas, seconds). Nodes are immutable and shared by graph
        # copies; a node's call key is a function of the node and its input metas (and a swap's
        # transfer of its input metas), so the same node object with the same input metas has
        # the same latency and its key need not be rendered again. The node is kept so that its
        # id cannot be reused by another object while the entry lives.
        self._by_node: dict[int, tuple[Node, tuple[TensorMeta, ...], tuple[float, float]]] = {}

    def node_seconds(self, g: Graph, nid: int) -> float:
        """Time node `nid` keeps its stream busy: on an asynchronous device (a GPU profile) its
        device time, without the host's cost of issuing it (issue_seconds); on a synchronous one
        the whole call. Swap nodes cost their host<->device transfer."""
        return self._times(g, nid)[0]

    def issue_seconds(self, g: Graph, nid: int) -> float:
        """Host seconds the issuing thread spends on node `nid` before the device can run it (a
        launch, a view's Python and dispatcher work): 0 on a synchronous device, where that is
        part of node_seconds, and for nodes run on the host (their worker thread issues them)."""
        return self._times(g, nid)[1]

    def _times(self, g: Graph, nid: int) -> tuple[float, float]:
        """(stream seconds, issue seconds) of node `nid`, memoized per node object."""
        node = g.nodes[nid]
        tensors = g.tensors
        metas = tuple([tensors[t] for t in node.input_tuple])
        hit = self._by_node.get(id(node))
        if hit is not None and hit[0] is node and hit[1] == metas:
            return hit[2]
        seconds = self._call_seconds(g, nid)
        issue = self._issue(g, nid)
        times = (seconds - issue, issue)
        if len(self._by_node) >= NODE_MEMO_LIMIT:
            self._by_node.clear()
        self._by_node[id(node)] = (node, metas, times)
        return times

    def _issue(self, g: Graph, nid: int) -> float:
        """The host's part of _call_seconds on an asynchronous device (issue_seconds)."""
        p = self.profile
        node = g.nodes[nid]
        if not p.asynchronous or (self.host is not self and node.tags.on_host):
            return 0.0
        info = lookup(node.op)
        if info is not None and info.kind is OpKind.VIEW and not is_swap(g, nid):
            return p.view_seconds
        run = node.tags.get(ForeachTag)
        if run is not None and run.size > 1:
            return p.launch_seconds / run.size
        return p.launch_seconds

    def _call_seconds(self, g: Graph, nid: int) -> float:
        if self.host is not self and g.nodes[nid].tags.on_host:
            return self.host._call_seconds(g, nid)
        if is_swap(g, nid):
            return self.copy_seconds(*swap_transfer(g, nid))
        key = call_key(g, nid)
        seconds = self._seconds.get(key)
        if seconds is None:
            seconds = self._node_estimate(g, nid)
            self._seconds[key] = seconds
        run = g.nodes[nid].tags.get(ForeachTag)
        if run is not None and run.size > 1:
            # one tensor's share of a list op (torch._foreach_*, fused): the list call launches once
            seconds -= self.profile.launch_seconds * (1 - 1 / run.size)
        return seconds

    def _node_estimate(self, g: Graph, nid: int) -> float:
        node = g.nodes[nid]
        if node.op in ALLOCATION_ONLY_OPS:
            return self.profile.launch_seconds
        if node.op in STARTS:       # on the link: one launch, then the collective's transfer
            nbytes = g.tensors[node.input_tuple[0]].nbytes
            return self.profile.launch_seconds + self.link.collective_seconds(
                node.op, nbytes, world_size_of(node.op, node.args))
        if node.op == WAIT_OP:      # the issuing thread records a wait: no device work
            return self.profile.launch_seconds
        return self.work_seconds(node_work(g, nid))

    def work_seconds(self, work: NodeWork) -> float:
        """Latency of a call doing `work` on this profile's device."""
        p = self.profile
        if work.kind is OpKind.VIEW:
            return p.view_seconds
        if work.kind in _TENSOR_CORE_KINDS:
            rate = p.matmul_rate(work.dtype, self.tf32)
        else:
            rate = p.vector_rate(work.dtype)
        compute = ramp_seconds(work.flops, rate, p.compute_half(rate))
        memory = ramp_seconds(work.bytes, p.memory_bandwidth, p.memory_half_bytes)
        return p.launch_seconds + max(compute, memory)

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        """launch + nbytes / effective host-link bandwidth in `direction` ("d2h" | "h2d")."""
        bandwidth = self.profile.host_bandwidth(direction)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return self.profile.launch_seconds + nbytes / bandwidth

    def __repr__(self) -> str:
        return f"AnalyticCostModel({self.name!r}, tf32={self.tf32})"
