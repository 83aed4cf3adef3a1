"""What peakcut does not plan of a model trained by more than one process is refused by name,
before anything changes.

Two gloo ranks on this CPU: a DistributedDataParallel module with a communication hook, its
inner module (ddp.module, not wrapped, under a process group of world size 2), an FSDP2
module with a mixed-precision policy and one with shards of unequal sizes, an FSDP
(FullyShardedDataParallel) module and a model with a DTensor parameter are each refused by
peakcut.optimize with an error that names what it found, and the parameters and the
optimizer state are what they were before the call. (Plain DDP and FSDP2 modules are
planned: tests/distributed.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import peakcut
from tests.distributed.spawn import run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2
TIMEOUT_S = 120.0
FAST = {"device": "h200", "time_budget": 0.5}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def make_mlp() -> tuple[MLP, tuple[torch.Tensor, torch.Tensor]]:
    """The same model and batch on every rank (tests.helpers imports the workloads: slow to spawn)."""
    torch.manual_seed(0)
    return MLP(), (torch.randn(6, 8), torch.randint(0, 4, (6,)))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A rank's own values of a tensor (a DTensor's local shard), copied."""
    local = t.to_local() if isinstance(t, torch.distributed.tensor.DTensor) else t
    return local.detach().clone()


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [_local(t) for t in (*model.parameters(), *model.buffers(), *state)]


def _refused(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor],
             match: str, error: type[Exception] = peakcut.CaptureError) -> None:
    before = _snapshot(model, opt)
    try:
        peakcut.optimize(model, batch, loss_fn, opt, **FAST)
    except error as e:
        if not re.search(match, str(e)):
            raise AssertionError(f"the error does not match {match!r}: {e}") from e
    else:
        raise AssertionError(f"not refused: {type(model).__name__} ({match})")
    after = _snapshot(model, opt)
    if not (len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))):
        raise AssertionError(f"the refusal of {type(model).__name__} changed parameters or optimizer state")


def _rank(rank: int, world: int) -> None:
    """One rank: DDP with a communication hook, DDP's inner module, FSDP2 with what peakcut
    does not plan, FSDP and a DTensor parameter are each refused."""
    model, batch = make_mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    loss_fn(ddp, batch).backward()           # one step in, so there is state to leave alone
    opt.step()
    opt.zero_grad(set_to_none=True)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    _refused(ddp, opt, batch, r"DistributedDataParallel: a communication hook \(fp16_compress_hook\)", ValueError)
    _refused(ddp.module, opt, batch, r"default process group \(backend 'gloo'\) has world size 2 "
                                     rf"\(this is rank {rank}\).*all-reduced")

    from torch.distributed.fsdp import (
        FullyShardedDataParallel,
        MixedPrecisionPolicy,
        fully_shard,
    )
    sharded, _ = make_mlp()
    fully_shard(sharded.fc1, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(sharded)
    _refused(sharded, torch.optim.AdamW(sharded.parameters()), batch,
             r"FSDP2: module 'fc1' has a MixedPrecisionPolicy", ValueError)
    uneven, _ = make_mlp()          # 3 rows cannot be split evenly over 2 ranks
    uneven.fc2 = nn.Linear(16, 3)
    fully_shard(uneven)
    _refused(uneven, torch.optim.AdamW(uneven.parameters()), batch,
             r"FSDP2: parameter 'fc2.weight' has 3 rows, not a multiple of the 2 ranks", ValueError)
    fsdp = FullyShardedDataParallel(make_mlp()[0], device_id=torch.device("cpu"))
    _refused(fsdp, torch.optim.AdamW(fsdp.parameters()), batch,
             r"the model is wrapped in FullyShardedDataParallel \(FSDP\)")

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    parallel, _ = make_mlp()          # tensor parallelism by hand: one DTensor parameter
    mesh = init_device_mesh("cpu", (WORLD,))
    parallel.fc1.weight = nn.Parameter(distribute_tensor(parallel.fc1.weight.detach(), mesh, [Shard(0)]))
    _refused(parallel, torch.optim.AdamW(parallel.parameters()), batch,
             r"parameter 'fc1\.weight' is a DTensor \(placements \(Shard\(dim=0\),\) on a device mesh "
             r"of 2 ranks\)")


def test_ddp_its_inner_module_and_fsdp_are_refused_on_two_ranks(tmp_path: Path) -> None:
    run_ranks(_rank, WORLD, tmp_path, timeout_s=TIMEOUT_S)
