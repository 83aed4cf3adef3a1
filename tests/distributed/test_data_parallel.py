"""A DistributedDataParallel step planned by peakcut trains as the user's DDP loop does.

Gloo ranks on this CPU (2 and 4 processes). On every rank the same model is trained twice
from the same weights: the user's eager DDP loop (forward, backward with DDP's all-reduce,
clip_grad_norm_ at 1.0, AdamW in two param groups) and `peakcut.optimize(ddp, ...)`'s plan
for the same DDP module, over 3 steps of that rank's own batches. The searched plans split
the step (fission) and recompute (remat), and start each bucket's all-reduce during the
backward, where the eager schedule starts them after it.

Tolerance: the models run in float64, and a plan differs from eager only in rounding (a
fission splits the batch's reductions; with 4 ranks gloo's ring sums buckets laid out
otherwise than DDP's): tests.tolerance for float64, the batch's tokens as the reduction
length, 3 steps. Parameters must be equal across ranks exactly (every rank applies the same
averaged gradients). The measured per-rank peak (the CPU profiler's allocator events) is
the simulated one within 5%, as in the single-process tests.
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
SEARCH = {"device": "cpu", "latency_limit": 1.5, "time_budget": 20.0, "max_states": 60}
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
    """Whether the plan starts a gradient all-reduce before the backward's last node."""
    from peakcut.ir.collectives import ALL_REDUCE_OP
    from peakcut.ir.node import Phase

    g, order = plan.program.graph, plan.program.order
    starts = [i for i, n in enumerate(order) if g.nodes[n].op == ALL_REDUCE_OP]
    backward = [i for i, n in enumerate(order) if g.nodes[n].phase is Phase.BACKWARD
                and g.nodes[n].op != ALL_REDUCE_OP and "collective" not in g.nodes[n].op]
    return bool(starts) and starts[0] < backward[-1]


def _trains_like_ddp(rank: int, world: int, kind: str, out: str) -> None:
    import peakcut
    from peakcut.memory import simulate

    eager, ours = _pair(kind)
    ddp_eager, ddp_ours = _ddp(eager), _ddp(ours)
    opt_eager, opt_ours = adamw_two_groups(eager), adamw_two_groups(ours)
    plan = _plan(kind, ddp_ours, opt_ours, rank)
    tol = tolerance(torch.float64, _batch(kind, rank, 0)[0].numel(), STEPS)
    for step in range(STEPS):
        batch = _batch(kind, rank, step)
        _close(plan.step(batch), eager_step(ddp_eager, opt_eager, batch, KINDS[kind][2]), f"loss {step}", tol)
    for (name, p), q in zip(ours.named_parameters(), eager.parameters(), strict=True):
        _close(p, q, name, tol)
    for (name, b), c in zip(ours.named_buffers(), eager.buffers(), strict=True):
        _close(b.double(), c.double(), name, tol)
    mine, theirs = opt_ours.state_dict()["state"], opt_eager.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            _close(mine[i][slot], value, f"state {i}.{slot}", tol)
    _same_across_ranks(ours)
    simulated = simulate(plan.program.graph, plan.program.order).peak_bytes
    measured = peakcut.measure(plan.program, ours, _batch(kind, rank, 0), method="cpu-profiler", repeats=1).peak_bytes
    Path(out, f"{kind}-{rank}.json").write_text(json.dumps({
        "applied": plan.report["applied"], "overlapped": _overlapped(plan),
        "simulated": simulated, "measured": measured}))


def _both(rank: int, world: int, out: str) -> None:
    for kind in KINDS:
        _trains_like_ddp(rank, world, kind, out)


def _results(out: Path, kind: str, world: int) -> list[dict]:
    return [json.loads((out / f"{kind}-{rank}.json").read_text()) for rank in range(world)]


def _check_plans(out: Path, kind: str, world: int, remat: bool) -> None:
    results = _results(out, kind, world)
    for r in results:
        assert r["applied"] == results[0]["applied"]        # one plan on every rank
        assert abs(r["simulated"] - r["measured"]) <= 0.05 * r["measured"], r
    applied = " ".join(results[0]["applied"])
    assert "fission" in applied, applied
    if remat:
        assert "remat" in applied, applied
    assert results[0]["overlapped"]


def test_ddp_plans_train_like_ddp_on_two_ranks(tmp_path: Path) -> None:
    run_ranks(_both, 2, tmp_path, str(tmp_path))
    _check_plans(tmp_path, "gpt", 2, remat=False)
    _check_plans(tmp_path, "cnn", 2, remat=True)


def _gpt_only(rank: int, world: int, out: str) -> None:
    _trains_like_ddp(rank, world, "gpt", out)


def test_ddp_plan_trains_like_ddp_on_four_ranks(tmp_path: Path) -> None:
    run_ranks(_gpt_only, 4, tmp_path, str(tmp_path), timeout_s=300.0)
    _check_plans(tmp_path, "gpt", 4, remat=False)
