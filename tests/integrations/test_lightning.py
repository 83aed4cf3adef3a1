"""A LightningModule trained through PlanStrategy against Lightning's own single-device run.

Ten steps of a small MLP (AdamW with weight decay from configure_optimizers, a per-step
StepLR, the Trainer's gradient_clip_val=1.0) from the same weights: the losses, parameters,
AdamW state and scheduler state agree within tests.tolerance for the run's dtype (float32, or
bfloat16 under "bf16-mixed" autocast) over the model's widest reduction (32) and the number of
steps, the bound the loop tests use: a plan may re-order or split reductions (and Lightning
sums the clipping norm in the optimizer's parameter order), which changes only the rounding.
Gradient accumulation over an epoch's five batches agrees the same way. A ModelCheckpoint
saved at the end of the first epoch and resumed with `ckpt_path` continues to the same numbers
(the runs are epoch-based: Lightning 2.6 resumes an end-of-epoch checkpoint of a max_steps run
inside the finished epoch, with or without peakcut). What a plan cannot do as the Trainer
would is refused.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.tolerance import tolerance

L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from peakcut.integrations.lightning import PlanStrategy  # noqa: E402

STEPS, WIDTH, BATCHES_PER_EPOCH = 10, 32, 5
PEAKCUT = {"device": "cpu", "time_budget": 5, "max_states": 8}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_module.py"


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.fc2 = nn.Linear(WIDTH, 4)
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(torch.relu(self.fc1(x))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(outputs["loss"].item())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    n = 4 * BATCHES_PER_EPOCH
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)),
                      batch_size=4)


def fit(peakcut: bool, precision: str = "32-true", ckpt_path: Path | None = None,
        module: L.LightningModule | None = None, **trainer: Any) -> tuple[L.LightningModule, Any]:
    """Train `module` (default: a fresh Module from seed 0) for two epochs, through PlanStrategy
    when `peakcut`; `trainer`: more or other Trainer arguments."""
    torch.manual_seed(0)
    module = module or Module()
    options: dict[str, Any] = dict(accelerator="cpu", devices=1, max_epochs=STEPS // BATCHES_PER_EPOCH,
                                   enable_progress_bar=False, logger=False, enable_model_summary=False,
                                   enable_checkpointing="callbacks" in trainer, gradient_clip_val=1.0,
                                   precision=precision)
    if peakcut:
        options["strategy"] = PlanStrategy(peakcut=PEAKCUT)
    run = L.Trainer(**{**options, **trainer})
    run.fit(module, loader(), ckpt_path=ckpt_path)
    return module, run


@functools.cache
def lightning_run(precision: str = "32-true", accumulate_grad_batches: int = 1) -> tuple[L.LightningModule, Any]:
    """Lightning's own run, made once per test session for each setting (read, never changed)."""
    return fit(False, precision, accumulate_grad_batches=accumulate_grad_batches)


def same(ours: tuple[Any, Any], ref: tuple[Any, Any], losses: list[float], dtype: torch.dtype) -> None:
    tol = tolerance(dtype, WIDTH, STEPS)
    (module, trainer), (ref_module, ref_trainer) = ours, ref
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_module.losses), rtol=tol, atol=tol)
    for (name, p), q in zip(module.named_parameters(), ref_module.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
    state, ref_state = trainer.optimizers[0].state_dict(), ref_trainer.optimizers[0].state_dict()
    assert state["param_groups"] == ref_state["param_groups"]
    for i, slots in ref_state["state"].items():
        for slot, value in slots.items():
            torch.testing.assert_close(state["state"][i][slot], value, rtol=tol, atol=tol,
                                       msg=lambda m, i=i, s=slot: f"state {i}.{s}: {m}")
    assert trainer.lr_scheduler_configs[0].scheduler.state_dict() == \
        ref_trainer.lr_scheduler_configs[0].scheduler.state_dict()
    assert trainer.global_step == ref_trainer.global_step == STEPS // trainer.accumulate_grad_batches
    torch.testing.assert_close(trainer.callback_metrics["train_loss"], ref_trainer.callback_metrics["train_loss"],
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_ten_steps_match_lightning(precision: str) -> None:
    ours = fit(True, precision)
    assert ours[1].strategy.plan is not None
    same(ours, lightning_run(precision), ours[0].losses, torch.float32 if precision == "32-true" else torch.bfloat16)


def test_gradient_accumulation_matches_lightning() -> None:
    ours = fit(True, accumulate_grad_batches=BATCHES_PER_EPOCH)
    same(ours, lightning_run(accumulate_grad_batches=BATCHES_PER_EPOCH), ours[0].losses, torch.float32)


def test_model_checkpoint_and_resume(tmp_path: Path) -> None:
    first = fit(True, max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)])
    (saved,) = tmp_path.glob("*.ckpt")
    resumed = fit(True, ckpt_path=saved)
    same(resumed, lightning_run(), first[0].losses + resumed[0].losses, torch.float32)


@pytest.mark.parametrize(("trainer", "module", "match"), [
    ({"accumulate_grad_batches": 2}, None, "divisible by 2"),
    ({"gradient_clip_algorithm": "value"}, None, "clips by norm only"),
    ({}, "on_after_backward", "overrides on_after_backward"),
    ({"devices": 2}, None, "trains on one device"),
])
def test_what_a_plan_cannot_do_is_refused(trainer: dict[str, Any], module: str | None, match: str) -> None:
    class Hooked(Module):
        def on_after_backward(self) -> None:
            pass

    with pytest.raises(ValueError, match=match):
        fit(True, module=Hooked() if module else Module(), **trainer)
    with pytest.raises(ValueError, match="come from the Trainer"):
        PlanStrategy(peakcut={"max_grad_norm": 1.0})


def test_other_logged_values_are_named() -> None:
    class Logs(Module):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            out = self(batch[0])
            self.log("mean_logit", out.mean())
            return nn.functional.cross_entropy(out, batch[1])

    with pytest.warns(UserWarning, match="training_step logs mean_logit"):
        fit(True, module=Logs(), max_steps=1)


def test_missing_lightning_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "peakcut.integrations.lightning")     # put back afterwards
    with pytest.raises(ImportError, match=r"peakcut\[lightning\]"):
        importlib.import_module("peakcut.integrations.lightning")


def test_example_runs() -> None:
    result = runpy.run_path(str(EXAMPLE), run_name="example")["main"](["--steps", "4"])
    tol = tolerance(torch.bfloat16, WIDTH, 4)
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["lightning_losses"]),
                               rtol=tol, atol=tol)
