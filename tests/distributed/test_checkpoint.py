"""DDP and FSDP2 plans and torch.distributed.checkpoint, and ranks that would run different plans.

Two gloo ranks on this CPU, the GPT-like model in float64, under DDP and under FSDP2:

- a DCP checkpoint of model and optimizer saved from a plan after step 2 is loaded into a
  fresh model and optimizer that take step 3 in the user's eager loop, and the reverse
  (saved from the eager loop, step 3 through a fresh plan): both equal the uninterrupted run
  (the same tolerance as tests/distributed/test_data_parallel.py; FSDP2's parameters and
  optimizer state are DTensors, saved and loaded sharded);
- ranks that call peakcut.optimize with batches of different shapes all raise RankMismatch,
  which names the ranks and their batch shapes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tests.distributed.models import TinyGPT, adamw_two_groups, gpt_batch, gpt_loss
from tests.distributed.test_data_parallel import WRAPS, _close, _full, eager_step
from tests.tolerance import tolerance

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

SEARCH = {"device": "cpu", "time_budget": 10.0, "max_states": 8, "max_grad_norm": 1.0}


def _fresh(wrap: str = "ddp") -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    """The model, the model as the loop calls it (the DDP module, or the FSDP2 model itself)
    and its optimizer."""
    torch.manual_seed(0)
    model = TinyGPT().double()
    wrapped = WRAPS[wrap](model)
    return model, wrapped, adamw_two_groups(model)


def _save(model: torch.nn.Module, opt: torch.optim.Optimizer, where: str) -> None:
    state, optim = get_state_dict(model, opt)
    dcp.save({"model": state, "optim": optim}, checkpoint_id=where)


def _load(model: torch.nn.Module, opt: torch.optim.Optimizer, where: str) -> None:
    state, optim = get_state_dict(model, opt)
    loaded = {"model": state, "optim": optim}
    dcp.load(loaded, checkpoint_id=where)
    set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])


def _resumes(rank: int, world: int, out: str, wrap: str) -> None:
    import peakcut

    batches = [gpt_batch(rank, step, 8) for step in range(3)]
    tol = tolerance(torch.float64, batches[0][0].numel(), 3)
    ref, ref_ddp, ref_opt = _fresh(wrap)                     # uninterrupted eager run
    ref_losses = [eager_step(ref_ddp, ref_opt, b, gpt_loss) for b in batches]

    model, ddp, opt = _fresh(wrap)                           # plan for 2 steps, save, eager step 3
    plan = peakcut.optimize(ddp, batches[0], gpt_loss, opt, **SEARCH)
    for b, expected in zip(batches[:2], ref_losses, strict=False):
        _close(plan.step(b), expected, "plan loss", tol)
    _save(model, opt, f"{out}/{wrap}-from-plan")
    resumed, resumed_ddp, resumed_opt = _fresh(wrap)
    _load(resumed, resumed_opt, f"{out}/{wrap}-from-plan")
    _close(eager_step(resumed_ddp, resumed_opt, batches[2], gpt_loss), ref_losses[2], "eager after plan", tol)
    for (name, p), q in zip(resumed.named_parameters(), ref.parameters(), strict=True):
        _close(_full(p), _full(q), f"eager after plan: {name}", tol)

    model, ddp, opt = _fresh(wrap)                           # eager for 2 steps, save, plan step 3
    for b in batches[:2]:
        eager_step(ddp, opt, b, gpt_loss)
    _save(model, opt, f"{out}/{wrap}-from-eager")
    resumed, resumed_ddp, resumed_opt = _fresh(wrap)
    _load(resumed, resumed_opt, f"{out}/{wrap}-from-eager")
    plan = peakcut.optimize(resumed_ddp, batches[2], gpt_loss, resumed_opt, **SEARCH)
    _close(plan.step(batches[2]), ref_losses[2], "plan after eager", tol)
    for (name, p), q in zip(resumed.named_parameters(), ref.parameters(), strict=True):
        _close(_full(p), _full(q), f"plan after eager: {name}", tol)
    ref_state, mine = ref_opt.state_dict()["state"], resumed_opt.state_dict()["state"]
    for i, slots in ref_state.items():
        for slot, value in slots.items():
            _close(_full(mine[i][slot]), _full(value), f"plan after eager: state {i}.{slot}", tol)


def _mismatched(rank: int, world: int, out: str) -> None:
    import peakcut
    from peakcut.optimizer.data_parallel import RankMismatch

    _, ddp, opt = _fresh()
    batch = gpt_batch(rank, 0, 8 if rank == 0 else 6)
    try:
        peakcut.optimize(ddp, batch, gpt_loss, opt, **SEARCH)
    except RankMismatch as e:
        if not re.search(r"ranks \[1\] would run a different captured step than rank 0.*rank 0: \(8, 16\) "
                         r"int64.*rank 1: \(6, 16\) int64", str(e)):
            raise AssertionError(f"unexpected message: {e}") from e
        Path(out, f"refused-{rank}").write_text(str(e))
    else:
        raise AssertionError("ranks with different batch shapes were not refused")


def _both(rank: int, world: int, out: str) -> None:
    for wrap in WRAPS:
        _resumes(rank, world, out, wrap)
    _mismatched(rank, world, out)


def test_dcp_checkpoints_cross_between_plan_and_eager_and_mismatched_ranks_are_refused(tmp_path: Path) -> None:
    from tests.distributed.spawn import run_ranks

    run_ranks(_both, 2, tmp_path, str(tmp_path))
    assert all((tmp_path / f"refused-{rank}").exists() for rank in range(2))
