"""When each storage is live: the alloc/free rules of device memory, once, in array form.

The rules (every simulator calls this module for them: the step simulation, the timed
memory curve of peakcut.simulate and the scheduler's Problem):

- a storage of a program input (batch, parameters, buffers, optimizer state) is held by
  the caller for the whole step: it counts in the baseline, never allocated nor freed;
- a host storage (an output of a swap-out, peakcut.store, or a program input kept in host
  memory between steps, Graph.host_inputs) is not device memory: never counted;
- every other storage is allocated when the first node that touches it (reads or writes
  a tensor in it) runs, and freed after the last node that touches it; views and in-place
  results share their base's storage and add nothing;
- a storage of a program output lives to the end of the step.

`storage_touches(g, nodes)` lists, once per graph and node sequence, which node touches
which storage; `spans` turns that into the (first, last) position of every storage for
any order of those nodes, `last_by_end` picks the freeing node when nodes overlap in time
(streams), and `live_bytes` sums the storages live at each position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from peakcut.ir.graph import Graph

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class StorageTouches:
    """The device storages a step allocates and the nodes that touch them.

    Nodes are named by their index in the sequence the structure was built from
    (`storage_touches(g, nodes)`); storages by their index k in `storages`, numbered in the
    order that sequence first touches them. Arrays are read-only by convention.

    storages[k]: storage id; owner[k]: the tensor through which the sequence first touches
    it (an output of its allocating node when the sequence is topological); size[k]: its
    bytes; to_end[k]: a program output storage, live to the end. touch_storage[j] /
    touch_node[j]: the j-th touch (a node reading or writing a tensor in a storage), in
    node order (a node may touch a storage more than once). held: caller-held storages
    (Graph.caller_held_storages less the host storages); baseline: their bytes.
    """

    n: int
    storages: list[int]
    owner: list[int]
    size: Int64Array
    to_end: BoolArray
    touch_storage: Int64Array
    touch_node: Int64Array
    held: set[int]
    baseline: int


def storage_touches(g: Graph, nodes: Sequence[int]) -> StorageTouches:
    """Which of the graph's nodes `nodes` (node ids; named 0..len-1 by position) touch which
    device storage the step allocates (see the module docstring for what counts)."""
    host = g.host_storages()
    held = g.caller_held_storages() - host        # host-resident inputs take no device memory
    index: dict[int, int] = dict.fromkeys(held, -1)   # storage id -> k, or -1: never counted
    index.update(dict.fromkeys(host, -1))
    storages: list[int] = []
    owner: list[int] = []
    touched: list[int] = []
    toucher: list[int] = []
    add_storage = touched.append
    add_node = toucher.append
    get = index.get
    node_of = g.nodes
    tensors = g.tensors
    for v, nid in enumerate(nodes):
        node = node_of[nid]
        for touched_tensors in (node.output_tuple, node.input_tuple):   # outputs first: owners
            for t in touched_tensors:
                s = tensors[t].storage
                k = get(s)
                if k is None:
                    k = index[s] = len(storages)
                    storages.append(s)
                    owner.append(t)
                elif k < 0:
                    continue
                add_storage(k)
                add_node(v)
    sizes = g.storages
    outs = g.output_storages()
    count = len(storages)
    return StorageTouches(
        n=len(nodes),
        storages=storages,
        owner=owner,
        size=np.fromiter(map(sizes.__getitem__, storages), dtype=np.int64, count=count),
        to_end=np.fromiter(map(outs.__contains__, storages), dtype=np.bool_, count=count),
        touch_storage=np.fromiter(touched, dtype=np.int64, count=len(touched)),
        touch_node=np.fromiter(toucher, dtype=np.int64, count=len(toucher)),
        held=held,
        baseline=sum(sizes[s] for s in held),
    )


def spans(touches: StorageTouches, position: Int64Array | None = None) -> tuple[Int64Array, Int64Array]:
    """(first, last) position of every storage: of the first node that touches it and of the
    last (n - 1 for program output storages). position[v]: where node v runs; None: in the
    sequence the touches were built from."""
    m = len(touches.storages)
    at = touches.touch_node if position is None else position[touches.touch_node]
    first = np.full(m, touches.n, dtype=np.int64)
    last = np.full(m, -1, dtype=np.int64)
    np.minimum.at(first, touches.touch_storage, at)
    np.maximum.at(last, touches.touch_storage, at)
    last[touches.to_end] = touches.n - 1
    return first, last


def last_by_end(touches: StorageTouches, end: FloatArray) -> Int64Array:
    """The node that frees each storage when nodes overlap in time: of the nodes touching it,
    the one that ends last (end[v]: end time of node v), at equal end times the later in the
    sequence; -1 for program output storages (never freed)."""
    m = len(touches.storages)
    node = touches.touch_node
    storage = touches.touch_storage
    ends = end[node]
    latest = np.full(m, -np.inf, dtype=np.float64)
    np.maximum.at(latest, storage, ends)
    at_latest = ends == latest[storage]
    last = np.full(m, -1, dtype=np.int64)
    np.maximum.at(last, storage[at_latest], node[at_latest])
    last[touches.to_end] = -1
    return last


def live_bytes(size: Int64Array, first: Int64Array, last: Int64Array, n: int) -> Int64Array:
    """Bytes of the storages live at each of n positions: storage k from first[k] to last[k]."""
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, size)
    np.subtract.at(delta, last + 1, size)
    return np.cumsum(delta[:n])
