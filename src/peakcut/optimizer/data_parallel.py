"""One plan on every rank of a DistributedDataParallel or FSDP2 step.

Every rank captures its own step; the ranks then compare digests of what they captured and
of the options they search with (an all-gather), and refuse together, naming the ranks, when
they differ: ranks that ran different programs would issue different collectives and hang
or compute wrong averages. Rank 0 alone searches (a search under a time budget is not
deterministic across processes), then broadcasts its program (graph as JSON, order, report)
to the others, which run exactly that program. A search that fails on rank 0 fails on every
rank with rank 0's message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from peakcut.ir.graph import Graph
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.optimizer.plan import Program
from peakcut.spec.data_parallel import DataParallelSpec
from peakcut.spec.fully_sharded import FullyShardedSpec

Ranks = DataParallelSpec | FullyShardedSpec


class RankMismatch(RuntimeError):
    """Ranks of one data-parallel step would run different plans."""


def step_digest(g: Graph, options: dict[str, Any]) -> str:
    """A digest of the captured step and the search's options (sha256, hex)."""
    text = graph_to_json(g) + json.dumps(options, sort_keys=True, default=_canonical)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: Any) -> Any:
    """A JSON form of an option that is the same in every process (sets sorted, not hashed)."""
    if isinstance(value, (set, frozenset)):
        return sorted(str(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return repr(value)


def _group(spec: Ranks) -> dist.ProcessGroup:
    return dist.distributed_c10d._resolve_process_group(spec.group_name)  # type: ignore[arg-type]


def check_same_step(g: Graph, options: dict[str, Any], spec: Ranks, what: str) -> None:
    """Raise RankMismatch on every rank when the ranks' `what` (a captured step and its
    search options) differ."""
    group = _group(spec)
    mine = (step_digest(g, options), _shapes(g))
    everyone: list[Any] = [None] * spec.world_size
    dist.all_gather_object(everyone, mine, group=group)
    differing = [r for r, (digest, _) in enumerate(everyone) if digest != everyone[0][0]]
    if differing:
        detail = "; ".join(f"rank {r}: {everyone[r][1]}" for r in [0, *differing[:3]])
        raise RankMismatch(
            f"{_kind(spec)}: ranks {differing} would run a different {what} than rank 0 (the batch's "
            f"shapes and dtypes, the model, the optimizer or the options given to peakcut.optimize differ: "
            f"{detail}); every rank must call peakcut.optimize with the same model, optimizer, options and "
            "batch shapes")


def _kind(spec: Ranks) -> str:
    return "FSDP2" if isinstance(spec, FullyShardedSpec) else "DistributedDataParallel"


def _shapes(g: Graph) -> str:
    """The batch inputs' shapes and dtypes, for the mismatch message."""
    batch = [g.tensors[t] for t in g.inputs if (g.tensors[t].name or "").startswith("batch:")]
    return ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in batch) or "no batch tensors"


def rank_zero_program(search: Callable[[], Program], spec: Ranks) -> Program:
    """Rank 0's `search()`, broadcast to every rank of the group."""
    group = _group(spec)
    payload: list[Any] = [None]
    if spec.rank == 0:
        try:
            program = search()
            payload = [("ok", graph_to_json(program.graph), program.order, program.report,
                        program.feasible, program.why_not)]
        except Exception as e:          # every rank fails with rank 0's error
            payload = [("error", f"{type(e).__name__}: {e}")]
            dist.broadcast_object_list(payload, group=group, group_src=0)
            raise
    dist.broadcast_object_list(payload, group=group, group_src=0)
    sent = payload[0]
    if sent[0] == "error":
        raise RuntimeError(f"{_kind(spec)}: rank 0's search failed: {sent[1]}")
    if spec.rank == 0:
        return program
    _, graph_json, order, report, feasible, why_not = sent
    return Program(graph_from_json(graph_json), list(order), report, feasible, why_not)


def check_same_program(program: Program, spec: Ranks) -> None:
    """Raise RankMismatch when the ranks' programs differ (after the broadcast, they must not)."""
    check_same_step(program.graph, {"order": list(program.order)}, spec, "plan")


__all__ = ["RankMismatch", "check_same_program", "check_same_step", "rank_zero_program", "step_digest"]
