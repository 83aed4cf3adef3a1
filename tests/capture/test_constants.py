"""Tensors the step reads that are neither parameters, buffers nor batch: a noise schedule in
loss_fn's closure, a plain tensor attribute of a module, a module-level global. They are lifted
as `const:` inputs bound to the user's tensor at every step: several AdamW steps give eager's
numbers (an in-place change of the schedule between steps included), the report lists them,
and what cannot be lifted is refused by shape, dtype and reader with the model left alone.

Tolerance: tests.tolerance for float32 over the widest reduction (32) and the steps taken.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import peakcut
from peakcut.codegen import StepBindingError
from peakcut.ir.tensor import Role
from tests.tolerance import tolerance

SEARCH = {"time_budget": 20, "max_states": 12, "device": "h200"}
T = 50
STEPS = 4
OFFSET = torch.linspace(-0.1, 0.1, 8)      # a module-level global the loss reads


def schedule() -> torch.Tensor:
    return torch.cumprod(1 - torch.linspace(1e-4, 0.2, T), 0)


class Denoiser(nn.Module):
    """Predicts the noise from x_t and the timestep."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(T, 16)
        self.fc1 = nn.Linear(8 + 16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(torch.cat([x, self.embed(t)], -1))))


def ddpm_loss(alphas_cumprod: torch.Tensor) -> Callable[[nn.Module, Any], torch.Tensor]:
    """The DDPM loss with the schedule closed over and indexed by the batch's timesteps."""
    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x0, t, noise = batch
        a = alphas_cumprod[t].unsqueeze(-1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(model(xt, t) + OFFSET, noise)
    return loss_fn


class Scheduler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alphas_cumprod = schedule()        # a plain attribute, not a registered buffer
        self.calls = torch.zeros((), dtype=torch.int64)


class Diffusion(nn.Module):
    """The schedule on a submodule as a plain tensor attribute; forward returns the loss and
    counts its calls in place (a 0-dim plain attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler = Scheduler()
        self.net = Denoiser()
        self.scale = torch.tensor(0.5)

    def forward(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        self.scheduler.calls.add_(1)
        a = self.scheduler.alphas_cumprod[t].unsqueeze(-1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(self.net(xt, t), noise) * self.scale


def diffusion_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(*batch)


def batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, T, (6,), generator=g), torch.randn(6, 8, generator=g))
            for _ in range(n)]


def close(a: torch.Tensor, b: torch.Tensor, steps: int, what: str) -> None:
    tol = tolerance(torch.float32, 32, steps)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def _same_steps(model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor],
                ref_loss: Callable[[nn.Module, Any], torch.Tensor], run: Callable[[Any], torch.Tensor],
                ref: nn.Module, between: Callable[[], None] = lambda: None) -> None:
    """STEPS steps of `run` against eager AdamW on `ref`, new batches each step; `between`
    runs after each step (a user's in-place change)."""
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for k, batch in enumerate(batches(STEPS)):
        got = run(batch)
        expected = ref_loss(ref, batch)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        close(got, expected.detach(), k + 1, f"loss {k}")
        between()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        close(p, q, STEPS, name)


def test_a_schedule_in_loss_fns_closure_and_a_global_are_lifted_and_give_eager_numbers() -> None:
    torch.manual_seed(0)
    model = Denoiser()
    ref = copy.deepcopy(model)
    mine, theirs = schedule(), schedule()
    g = peakcut.capture(model, batches(1)[0], ddpm_loss(mine), "adamw")
    names = [n for n in g.input_names if n.startswith("const:")]
    assert [n.partition("@")[0] for n in names] == ["const:held:loss_fn.alphas_cumprod",
                                                     f"const:global:{__name__}:OFFSET"]
    for name in names:
        assert g.tensors[g.inputs[g.input_names.index(name)]].role is Role.BUFFER    # caller-held
    notes = "\n".join(g.signature.notes)
    assert "variable 'alphas_cumprod' in loss_fn's closure" in notes and f"({T},) float32" in notes
    assert "global 'OFFSET'" in notes

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = peakcut.build(g, optimizer=opt)

    def change() -> None:          # the user's in-place change between steps is seen
        mine.mul_(0.99)
        theirs.mul_(0.99)
    _same_steps(model, ddpm_loss(mine), ddpm_loss(theirs), lambda b: step(model, b), ref, change)


def test_plain_tensor_attributes_are_bound_to_the_model_and_updated_in_place() -> None:
    torch.manual_seed(0)
    model = Diffusion()
    ref = copy.deepcopy(model)
    g = peakcut.capture(model, batches(1)[0], diffusion_loss, "adamw")
    assert [n for n in g.input_names if n.startswith("const:")] == [
        "const:attr:scheduler.calls", "const:attr:scheduler.alphas_cumprod", "const:attr:scale"]
    assert int(model.scheduler.calls) == 0          # capture ran nothing for real
    step = peakcut.build(g, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    _same_steps(model, diffusion_loss, diffusion_loss, lambda b: step(model, b), ref)
    assert int(model.scheduler.calls) == int(ref.scheduler.calls) == STEPS


def test_optimize_with_a_closed_over_schedule_reports_it_and_gives_eager_numbers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Denoiser()
    ref = copy.deepcopy(model)
    alphas = schedule()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, batches(1)[0], ddpm_loss(alphas), opt, **SEARCH)
    listed = [n for n in plan.report["capture_notes"] if n.startswith("constant const:held:loss_fn.alphas_cumprod")]
    assert listed and f"({T},) float32" in listed[0] and "read in loss_fn" in listed[0]
    _same_steps(model, ddpm_loss(alphas), ddpm_loss(alphas), plan.step, ref)


def test_a_saved_plan_binds_a_module_attribute_of_the_model_it_is_loaded_for(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Diffusion()
    ref = copy.deepcopy(model)
    plan = peakcut.optimize(model, batches(1)[0], diffusion_loss, "adamw", **SEARCH)
    plan.save(tmp_path / "plan")
    loaded = peakcut.load_plan(tmp_path / "plan", ref)
    for batch in batches(2):
        close(loaded.step(batch), plan.step(batch), 1, "loss")
    assert int(ref.scheduler.calls) == 2


class ReadsAParameterOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _refused(model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor], match: str,
             runs_eagerly: bool = True) -> None:
    """peakcut.optimize refuses with a CaptureError matching `match`; the parameters and the
    AdamW state (one eager step in, where the model runs eagerly) are left as they were."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = batches(1)[0]
    if runs_eagerly:
        loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    before = [t.detach().clone() for t in (*model.parameters(), *(v for s in opt.state.values() for v in s.values()))]
    with pytest.raises(peakcut.CaptureError, match=match):
        peakcut.optimize(model, batch, loss, opt, device="h200", time_budget=0.5)
    after = [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_tensor_that_requires_grad_is_refused_by_shape_dtype_and_reader() -> None:
    extra = torch.zeros(8, requires_grad=True)

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return F.mse_loss(m(b[0], b[1]) + extra, b[2])
    _refused(Denoiser(), loss, r"loss_fn reads a tensor of shape \(8,\) float32 \(variable 'extra' in loss_fn's "
             r"closure\).*requires grad and is not a parameter")


def test_a_parameter_read_from_outside_the_model_is_refused_by_its_name() -> None:
    model = ReadsAParameterOutside()
    weight = model.fc.weight

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return F.mse_loss(m(b[0], b[1]) + weight.sum(), b[2])
    _refused(model, loss, r"shape \(8, 8\) float32.*the model's parameter 'fc\.weight'")


class MetaAttribute(Denoiser):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.empty(8, device="meta")

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return super().forward(x, t) + self.table


def test_a_detached_parameter_read_from_outside_the_model_is_refused() -> None:
    """A .detach() shares the parameter's memory: as a constant it would not follow the update."""
    model = ReadsAParameterOutside()
    weight = model.fc.weight.detach()

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return F.mse_loss(m(b[0], b[1]) + weight.sum(), b[2])
    _refused(model, loss, r"shape \(8, 8\) float32.*shares memory with the model's parameter 'fc\.weight'")


def test_a_meta_attribute_is_refused_by_shape_dtype_and_module() -> None:
    _refused(MetaAttribute(), lambda m, b: F.mse_loss(m(b[0], b[1]), b[2]),
             r"MetaAttribute\.forward reads a tensor of shape \(8,\) float32 \(model attribute 'table'.*meta",
             runs_eagerly=False)


class RebindsItsAttribute(Denoiser):
    """Keeps a running mean as a plain attribute it rebinds at every call."""

    def __init__(self) -> None:
        super().__init__()
        self.running = torch.zeros(8)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        y = super().forward(x, t)
        self.running = 0.9 * self.running + 0.1 * y.detach().mean(0)
        return y


def test_an_attribute_the_forward_rebinds_is_refused() -> None:
    _refused(RebindsItsAttribute(), lambda m, b: F.mse_loss(m(b[0], b[1]), b[2]),
             r"RebindsItsAttribute\.forward reads .*\(model attribute 'running'.*assigns another tensor to model "
             r"attribute 'running'")


def test_a_sparse_constant_is_refused_by_its_kind() -> None:
    adj = torch.eye(6).to_sparse()

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return F.mse_loss(torch.sparse.mm(adj, m(b[0], b[1])), b[2])
    _refused(Denoiser(), loss, r"loss_fn reads a tensor of shape \(6, 6\) float32 .*a sparse COO tensor")


def test_a_closure_tensor_that_is_gone_is_named_at_the_step() -> None:
    model = Denoiser()
    g = peakcut.capture(model, batches(1)[0], ddpm_loss(schedule()), "adamw")
    gc.collect()
    other = ddpm_loss(schedule())       # a new capture with a closure variable of the same name
    g2 = peakcut.capture(model, batches(1)[0], other, "adamw")
    assert g2.input_names != g.input_names
    with pytest.raises(StepBindingError, match="const:held:loss_fn.alphas_cumprod@[0-9a-f]+: the tensor .* is gone"):
        peakcut.build(g)(model, batches(1)[0])


def test_a_plan_keeps_the_closure_tensors_it_reads_alive() -> None:
    """A loss_fn made inline holds the only reference to its schedule; the plan keeps it."""
    torch.manual_seed(0)
    model = Denoiser()
    ref = copy.deepcopy(model)
    plan = peakcut.optimize(model, batches(1)[0], ddpm_loss(schedule()), "adamw", replan=False, device="h200",
                            time_budget=0.5)
    gc.collect()
    ref_opt = torch.optim.AdamW(ref.parameters())
    for k, batch in enumerate(batches(2)):
        expected = ddpm_loss(schedule())(ref, batch)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        close(plan.step(batch), expected.detach(), k + 1, f"loss {k}")
