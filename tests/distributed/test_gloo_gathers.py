"""All-gathers on gloo as generated programs run them (ir.collectives.all_gather_into_tensor).

With three or more functional all-gathers in flight, torch 2.13's gloo corrupts the heap
(`malloc(): unaligned tcache chunk detected`, or a segfault) within a few thousand rounds;
a captured FSDP2 step starts one per parameter ahead of its reads (collectives.overlapped_order),
and two ranks running its program crashed in two runs of three. The program calls peakcut's
all-gather, which waits for it at once on gloo (no work is left registered after it): nine
started before their waits, for 600
rounds (with the functional all-gather instead, 500 rounds crashed one run of three), gather what
the ranks hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from peakcut.codegen.calls import op_target
from peakcut.ir.collectives import ALL_GATHER_OP
from tests.distributed.spawn import run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

ROUNDS, IN_FLIGHT = 600, 9


def test_generated_programs_call_peakcuts_all_gather() -> None:
    assert op_target(ALL_GATHER_OP) == "torch.ops.peakcut.all_gather_into_tensor.default"


def _gathers(rank: int, world: int) -> None:
    import peakcut.ir.collectives  # noqa: F401  (registers peakcut's ops)

    group = dist.group.WORLD.group_name
    shards = [torch.full((4 * (i + 1), 8), float(rank * 100 + i), dtype=torch.float64) for i in range(IN_FLIGHT)]
    registry = torch._C._distributed_c10d._get_work_registry_size
    first = torch.ops.peakcut.all_gather_into_tensor.default(shards[0], world, group)
    if registry() != 0:             # gloo's all-gather was waited for at once: no work left registered
        raise AssertionError(f"{registry()} collectives in flight after peakcut's all-gather on gloo")
    torch.ops.peakcut.wait_collective.default(first, [])
    for _ in range(ROUNDS):
        gathered = [torch.ops.peakcut.all_gather_into_tensor.default(s, world, group) for s in shards]
        churn = [torch.empty(17, 3) for _ in range(20)]       # the heap in use meanwhile
        for t in gathered:
            torch.ops.peakcut.wait_collective.default(t, [])
        del churn
    for i, t in enumerate(gathered):
        rows = shards[i].shape[0]
        for r in range(world):
            if not torch.equal(t[r * rows:(r + 1) * rows], torch.full_like(shards[i], float(r * 100 + i))):
                raise AssertionError(f"gather {i}: rank {r}'s rows differ")


def test_nine_all_gathers_in_flight_on_gloo_gather_and_keep_the_heap(tmp_path: Path) -> None:
    run_ranks(_gathers, 2, tmp_path)
