"""DDP and FSDP2 steps planned by peakcut train as the user's own loops do.

Gloo ranks on this CPU (2 and 4 processes). On every rank the same model is trained twice
from the same weights: the user's eager loop (forward, backward with DDP's all-reduce or
FSDP2's all-gathers and reduce-scatters, clip_grad_norm_ at 1.0, AdamW in two param groups)
and `peakcut.optimize(model, ...)`'s plan for the same wrapped model, over 3 steps of that
rank's own batches, for a GPT-like model and a CNN with BatchNorm, each under
DistributedDataParallel and under fully_shard. The searched plans split the step (fission),
recompute (remat or checkpointed blocks), and run collectives while compute goes on (a
collective started before nodes that do not wait for it, where the captured order waits at
once).

Tolerance: the models run in float64, and a plan differs from eager only in rounding (a
fission splits the batch's reductions; with 4 ranks gloo's ring sums buckets laid out
otherwise than DDP's): tests.tolerance for float64, the batch's elements as the reduction
length, 3 steps. Under DDP the parameters must be equal across ranks exactly; under FSDP2
the gathered parameters are compared. The measured per-rank peak (the CPU profiler's
allocator events) is the simulated one within 5%, as in the single-process tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed.models import (
    TinyCNN,
    TinyGPT,
    adamw_two_groups,
    cnn_batch,
    cnn_loss,
    gpt_batch,
    gpt_loss,
)
from tests.distributed.spawn import run_ranks
from tests.tolerance import tolerance

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

STEPS = 3
BATCH = 8
SEARCH = {"device": "cpu", "latency_limit": 1.5, "time_budget": 10.0, "max_states": 24}
KINDS = {
    "gpt": (TinyGPT, gpt_batch, gpt_loss),
    "cnn": (TinyCNN, cnn_batch, cnn_loss),
}


def _batch(kind: str, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = KINDS[kind][1](rank, step, BATCH)
    return (x.double() if x.is_floating_point() else x), y


def _pair(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two float64 copies of the same model (the same weights on every rank)."""
    torch.manual_seed(0)
    eager = KINDS[kind][0]().double()
    ours = KINDS[kind][0]().double()
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def _ddp(model: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
    return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)   # several buckets


def _fsdp2(model: torch.nn.Module) -> torch.nn.Module:
    """fully_shard on each GPT block (or the CNN's first conv block), then on the root."""
    from torch.distributed.fsdp import fully_shard

    for unit in getattr(model, "blocks", [getattr(model, "conv1", None)]):
        fully_shard(unit)
    fully_shard(model)
    return model


WRAPS = {"ddp": _ddp, "fsdp2": _fsdp2}


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank calls it in the same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def eager_step(ddp: torch.nn.Module, opt: torch.optim.Optimizer, batch, loss_fn) -> torch.Tensor:
    loss = loss_fn(ddp, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _plan(kind: str, ddp: torch.nn.Module, opt: torch.optim.Optimizer, rank: int):
    import peakcut
    from peakcut.optimizer.children import MoveSettings

    return peakcut.optimize(ddp, _batch(kind, rank, 0), KINDS[kind][2], opt, max_grad_norm=1.0,
                            settings=MoveSettings.only("fission", "remat"), **SEARCH)


def _close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def _same_across_ranks(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        gathered = [torch.empty_like(p) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, p.detach())
        if not all(torch.equal(gathered[0], q) for q in gathered):
            raise AssertionError(f"parameter {name} differs across ranks")


def _overlapped(plan) -> bool:
    """Whether some collective runs while compute goes on: a node that is not a collective
    between a start and the wait for it (the captured order waits right after each start)."""
    from peakcut.ir.collectives import COLLECTIVE_OPS, STARTS, WAIT_OP

    g, order = plan.program.graph, plan.program.order
    ops = [g.nodes[n].op for n in order]
    pending = False
    for op in ops:
        if op in STARTS:
            pending = True
        elif op == WAIT_OP:
            pending = False
        elif pending and op not in COLLECTIVE_OPS and not op.startswith("aten.view"):
            return True
    return False


def _trains_like_eager(rank: int, world: int, kind: str, wrap: str, out: str) -> None:
    import peakcut
    from peakcut.memory import simulate

    eager, ours = _pair(kind)
    ddp_eager, ddp_ours = WRAPS[wrap](eager), WRAPS[wrap](ours)
    opt_eager, opt_ours = adamw_two_groups(eager), adamw_two_groups(ours)
    plan = _plan(kind, ddp_ours, opt_ours, rank)
    tol = tolerance(torch.float64, _batch(kind, rank, 0)[0].numel(), STEPS)
    for step in range(STEPS):
        batch = _batch(kind, rank, step)
        _close(plan.step(batch), eager_step(ddp_eager, opt_eager, batch, KINDS[kind][2]), f"loss {step}", tol)
    for (name, p), q in zip(ours.named_parameters(), eager.parameters(), strict=True):
        _close(_full(p), _full(q), name, tol)
    for (name, b), c in zip(ours.named_buffers(), eager.buffers(), strict=True):
        _close(b.double(), c.double(), name, tol)
    mine, theirs = opt_ours.state_dict()["state"], opt_eager.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            _close(_full(mine[i][slot]), _full(value), f"state {i}.{slot}", tol)
    if wrap == "ddp":
        _same_across_ranks(ours)
    simulated = simulate(plan.program.graph, plan.program.order).peak_bytes
    measured = peakcut.measure(plan.program, ours, _batch(kind, rank, 0), method="cpu-profiler", repeats=1).peak_bytes
    Path(out, f"{wrap}-{kind}-{rank}.json").write_text(json.dumps({
        "applied": plan.report["applied"], "overlapped": _overlapped(plan),
        "simulated": simulated, "measured": measured}))


def _every(rank: int, world: int, out: str) -> None:
    for wrap in WRAPS:
        for kind in KINDS:
            _trains_like_eager(rank, world, kind, wrap, out)


def _check_plans(out: Path, wrap: str, kind: str, world: int) -> None:
    results = [json.loads((out / f"{wrap}-{kind}-{rank}.json").read_text()) for rank in range(world)]
    for r in results:
        assert r["applied"] == results[0]["applied"]        # one plan on every rank
        assert abs(r["simulated"] - r["measured"]) <= 0.05 * r["measured"], r
    applied = " ".join(results[0]["applied"])
    assert "fission" in applied, applied
    assert results[0]["overlapped"], (wrap, kind)


def _check_all(out: Path, world: int) -> None:
    applied = []
    for wrap in WRAPS:
        for kind in KINDS:
            _check_plans(out, wrap, kind, world)
            applied.append(json.loads((out / f"{wrap}-{kind}-0.json").read_text())["applied"])
    assert any("remat" in " ".join(a) or "checkpoint" in " ".join(a) for a in applied), applied


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_and_fsdp2_plans_train_like_their_eager_loops(tmp_path: Path, world: int) -> None:
    run_ranks(_every, world, tmp_path, str(tmp_path), timeout_s=420.0)
    _check_all(tmp_path, world)
