"""Times each part of a split sum over edges on this CPU, as the split program runs it.

A chain (peakcut.transform.vertex_ranges.EdgeChain) is split alone at the given edge
offsets; each part's nodes (slices, gather, element-wise ops, index_add) are then run with
the aten calls and arguments the generated program has, on real index tensors (the batch's
``src`` and ``dst``, and slices of them) and random floats of the captured shapes for
everything else (a part's time depends on the indices, not on the values it adds). A part
runs on its own: the sum the part before left is a tensor of random values (one per shape,
shared; the step's other tensors one each, shared by every part and split). Each round times
every part once, in turn, so load on the machine falls on every part alike; a part's time is
the median over the rounds of the thread's CPU time (time_parts).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.tensor import dtype_from_name
from peakcut.transform.vertex_ranges import EdgeChain, VertexRangeTag, split_edge_chains


@dataclass
class PartProgram:
    """The nodes of one part of one chain, and their inputs made real."""

    nodes: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], int]]
    inputs: dict[int, torch.Tensor]

    def run(self) -> None:
        env = dict(self.inputs)
        for fn, args, kwargs, out in self.nodes:
            real = tuple(env[a.id] if isinstance(a, TensorRef) else a for a in args)
            env[out] = fn(*real, **kwargs)


def _aten(op: str) -> Callable[..., Any]:
    namespace, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)  # type: ignore[no-any-return]


def _real_input(g: Graph, tid: int, batch: Mapping[int, torch.Tensor], made: dict[Any, torch.Tensor],
                outside: frozenset[int]) -> torch.Tensor:
    """The batch's tensor, or random floats: one tensor per tensor of the captured step (shared
    by every part and split), one per shape for a sum the part before left."""
    if tid in batch:
        return batch[tid]
    meta = g.tensors[tid]
    dtype = dtype_from_name(meta.dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"{meta.name}: an integer tensor that is not a batch input; its values are unknown")
    key = tid if tid in outside else ("sum", meta.shape, meta.dtype)
    if key not in made:
        gen = torch.Generator().manual_seed(len(made))
        made[key] = torch.randn(meta.shape, generator=gen, dtype=torch.float32).to(dtype)
    return made[key]


def part_programs(g: Graph, chain: EdgeChain, parts: int, offsets: Sequence[int],
                  batch: Mapping[int, torch.Tensor], made: dict[Any, torch.Tensor]) -> list[PartProgram]:
    """One program per part of `chain` split at `offsets` (module docstring). `batch`: graph
    input tensor id -> its real tensor (at least the index tensors); `made`: the random inputs
    made so far, shared between calls."""
    r, reasons = split_edge_chains(g, g.order, [chain], parts, boundaries=offsets)
    if r is None:
        raise ValueError(f"the chain does not split: {reasons[0]}")
    sg = r.graph
    outside = frozenset(g.tensors)
    programs = []
    for k in range(parts):
        nids = [v for v in r.added if (tag := sg.nodes[v].tags.get(VertexRangeTag)) is not None and tag.part == k]
        produced = {t for v in nids for t in sg.nodes[v].output_ids()}
        nodes, inputs = [], {}
        for v in nids:
            node = sg.nodes[v]
            for t in node.input_tuple:
                if t not in produced and t not in inputs:
                    inputs[t] = _real_input(sg, t, batch, made, outside)
            nodes.append((_aten(node.op), tuple(node.args), dict(node.kwargs), node.output_ids()[0]))
        programs.append(PartProgram(nodes, inputs))
    return programs


def time_parts(programs: Sequence[PartProgram], rounds: int,
               clock: Callable[[], float] = time.thread_time) -> list[float]:
    """The median seconds of each program over `rounds` rounds (one warm-up round first), by
    `clock`: the thread's CPU time by default, which leaves out the time other processes hold
    the core (with one intra-op thread, torch.set_num_threads(1), all of a part's work runs on
    the calling thread)."""
    times: list[list[float]] = [[] for _ in programs]
    for r in range(rounds + 1):
        for k, p in enumerate(programs):
            t0 = clock()
            p.run()
            if r:
                times[k].append(clock() - t0)
    return [statistics.median(t) for t in times]
