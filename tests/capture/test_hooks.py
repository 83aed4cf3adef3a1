"""Hooks the user registered: each is traced into the step (eager's numbers over a few AdamW
steps, and a note that names it) or refused by name with the model and optimizer untouched.

Plans come from peakcut.optimize with a bounded search, so the program may be re-ordered or
transformed; the eager reference runs the same loop on a copy of the model with the same
hooks. Every hook here changes the numbers (checked against the loop without it), so a hook
that was skipped would fail the comparison.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.modules.module as module_hooks
from torch import nn

import peakcut
from tests.tolerance import tolerance

# PyTorch's own warnings about the hooks themselves (the deprecated non-full backward hook; a
# full backward hook on a first layer, whose inputs need no gradient), as in eager
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning",
                                        "ignore:Full backward hook is firing:UserWarning")

SEARCH = {"time_budget": 20, "max_states": 12, "device": "h200"}
STEPS = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def loss_fn(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def data(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)


def close(a: torch.Tensor, b: torch.Tensor, steps: int, what: str) -> None:
    tol = tolerance(torch.float32, 32, steps)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


# --- the hooks (each changes the step's numbers) ------------------------------------------

def rescale_output(_m: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 0.5 + 0.5


def shift_input(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return (args[0] + 1.0,)


def shift_output_with_kwargs(_m: nn.Module, _args: Any, _kwargs: Any, out: torch.Tensor) -> torch.Tensor:
    return out + 0.1


def double_input_with_kwargs(_m: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
    return (args[0] * 2.0,), kwargs


def clamp_grad_input(_m: nn.Module, grad_input: Any, _grad_output: Any) -> tuple[Any, ...]:
    return tuple(None if g is None else g.clamp(-1e-3, 1e-3) for g in grad_input)


def clamp_grad_output(_m: nn.Module, grad_output: Any) -> tuple[Any, ...]:
    return tuple(None if g is None else g.clamp(-1e-3, 1e-3) for g in grad_output)


def make_inputs_require_grads(_m: nn.Module, _args: Any, out: torch.Tensor) -> None:
    """transformers' enable_input_require_grads hook (frozen embeddings, e.g. under PEFT)."""
    out.requires_grad_(True)


def clamp_grad(g: torch.Tensor) -> torch.Tensor:
    return g.clamp(-0.01, 0.01)


def shift_grad(g: torch.Tensor) -> torch.Tensor:
    return g * 2.0 + 1e-3


def observe(_g: torch.Tensor) -> None:
    return None


def freeze_fc1_and_require_its_output_grads(m: Net) -> None:
    m.fc1.requires_grad_(False)
    m.fc1.register_forward_hook(make_inputs_require_grads)


INSTALL: dict[str, tuple[Callable[[Net], Any], str]] = {
    "forward hook": (lambda m: m.fc1.register_forward_hook(rescale_output),
                     "forward hook rescale_output on module 'fc1' (Linear)"),
    "forward pre-hook": (lambda m: m.fc2.register_forward_pre_hook(shift_input),
                         "forward pre-hook shift_input on module 'fc2' (Linear)"),
    "forward hook with kwargs": (
        lambda m: m.fc1.register_forward_hook(shift_output_with_kwargs, with_kwargs=True, always_call=True),
        "forward hook shift_output_with_kwargs on module 'fc1' (Linear)"),
    "forward pre-hook with kwargs": (
        lambda m: m.register_forward_pre_hook(double_input_with_kwargs, with_kwargs=True),
        "forward pre-hook double_input_with_kwargs on the model (Net)"),
    "full backward hook": (lambda m: m.norm.register_full_backward_hook(clamp_grad_input),
                           "full backward hook clamp_grad_input on module 'norm' (LayerNorm)"),
    "full backward pre-hook": (lambda m: m.norm.register_full_backward_pre_hook(clamp_grad_output),
                               "full backward pre-hook clamp_grad_output on module 'norm' (LayerNorm)"),
    "backward hook (not full)": (lambda m: m.fc2.register_backward_hook(clamp_grad_input),
                                 "backward hook (register_backward_hook) clamp_grad_input on module 'fc2'"),
    "enable_input_require_grads": (freeze_fc1_and_require_its_output_grads,
                                   "forward hook make_inputs_require_grads on module 'fc1' (Linear)"),
    "tensor hook": (lambda m: m.fc1.weight.register_hook(clamp_grad),
                    "tensor hook clamp_grad on parameter 'fc1.weight': registered on the traced parameter"),
    "tensor hooks chained": (lambda m: (m.fc1.weight.register_hook(clamp_grad), m.fc1.weight.register_hook(shift_grad),
                                        m.fc2.bias.register_hook(observe)),
                             "tensor hook shift_grad on parameter 'fc1.weight'"),
}


@contextmanager
def global_hooks() -> Iterator[None]:
    """A global forward hook and a global full backward hook, removed afterwards."""
    def scale_linear_outputs(m: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor | None:
        return out * 0.9 if isinstance(m, nn.Linear) else None

    def clamp_norm_grad_input(m: nn.Module, grad_input: Any, grad_output: Any) -> Any:
        return clamp_grad_input(m, grad_input, grad_output) if isinstance(m, nn.LayerNorm) else None

    handles = [module_hooks.register_module_forward_hook(scale_linear_outputs),
               module_hooks.register_module_full_backward_hook(clamp_norm_grad_input)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def eager_loop(model: nn.Module, steps: int, max_grad_norm: float | None = None,
               optimizer: bool = True) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """The user's eager loop: the losses, and the optimizer it stepped."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses = []
    for k in range(steps):
        loss = loss_fn(model, data(k))
        loss.backward()
        losses.append(loss.detach())
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if optimizer:
            opt.step()
            opt.zero_grad()
    return losses, opt


def assert_same_as_eager(install: Callable[[Net], Any], note: str, *, max_grad_norm: float | None = None,
                         keep_grads: bool = False) -> None:
    torch.manual_seed(0)
    model = Net()
    plain, ref = copy.deepcopy(model), copy.deepcopy(model)
    install(model)
    install(ref)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, data(0), loss_fn, opt, max_grad_norm=max_grad_norm, keep_grads=keep_grads,
                            **SEARCH)
    assert any(n.startswith(note) for n in plan.graph.signature.notes), plan.graph.signature.notes
    assert all("its Python code ran only at capture" in n for n in plan.graph.signature.notes)

    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    for k in range(STEPS):
        loss = plan.step(data(k))
        ref_loss = loss_fn(ref, data(k))
        ref_loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), max_grad_norm)
        close(loss, ref_loss.detach(), k + 1, f"loss {k}")
        if keep_grads:
            for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
                assert (p.grad is None) == (q.grad is None), name
                if q.grad is not None:
                    close(p.grad, q.grad, k + 1, f"{name}.grad {k}")
        ref_opt.step()
        ref_opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        close(p, q, STEPS, name)
    assert opt.state.keys() and len(opt.state) == len(ref_opt.state)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert opt.state[p].keys() == ref_opt.state[q].keys()
        for slot, value in ref_opt.state[q].items():
            close(opt.state[p][slot], value, STEPS, f"state {slot}")

    eager_loop(plain, STEPS, max_grad_norm)          # the hook matters: without it the numbers differ
    assert any(not torch.allclose(p, q, rtol=1e-4, atol=1e-4)
               for p, q in zip(plain.parameters(), ref.parameters(), strict=True))


@pytest.mark.parametrize("kind", INSTALL)
def test_a_hook_is_traced_into_the_step(kind: str) -> None:
    install, note = INSTALL[kind]
    assert_same_as_eager(install, note)


def test_global_module_hooks_are_traced_into_the_step() -> None:
    torch.manual_seed(0)
    model = Net()
    plain = copy.deepcopy(model)
    eager_loop(plain, STEPS)                    # the reference without the hooks, before they exist
    with global_hooks():
        ref = copy.deepcopy(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        plan = peakcut.optimize(model, data(0), loss_fn, opt, **SEARCH)
        notes = plan.graph.signature.notes
        assert any(n.startswith("global forward hook global_hooks.<locals>.scale_linear_outputs on every "
                                "module (register_module_forward_hook)") for n in notes), notes
        assert any(n.startswith("global full backward hook global_hooks.<locals>.clamp_norm_grad_input")
                   for n in notes), notes
        ref_losses, _ = eager_loop(ref, STEPS)
        for k in range(STEPS):
            close(plan.step(data(k)), ref_losses[k], k + 1, f"loss {k}")
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        close(p, q, STEPS, name)
    assert any(not torch.allclose(p, q, rtol=1e-4, atol=1e-4)
               for p, q in zip(plain.parameters(), ref.parameters(), strict=True))


def test_a_tensor_hook_acts_before_clipping_and_on_the_kept_gradients() -> None:
    """As in eager: the hook changes the gradient, clip_grad_norm_ clips what it returned, and
    the gradients the step keeps (keep_grads, p.grad) are the clipped ones."""
    install, note = INSTALL["tensor hooks chained"]
    assert_same_as_eager(install, note, max_grad_norm=0.05, keep_grads=True)


def test_a_tensor_hook_without_an_optimizer_acts_on_p_grad() -> None:
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    for m in (model, ref):
        m.fc1.weight.register_hook(shift_grad)
    plan = peakcut.optimize(model, data(0), loss_fn, None, **SEARCH)
    for k in range(2):                          # .grad accumulates over two calls, as in eager
        close(plan.step(data(k)), loss_fn(ref, data(k)).detach(), 1, "loss")
        loss_fn(ref, data(k)).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        close(p.grad, q.grad, 2, f"{name}.grad")


def test_a_hook_on_a_frozen_parameter_is_not_noted() -> None:
    """It never runs, in eager either: a frozen parameter gets no gradient."""
    torch.manual_seed(0)
    model = Net()
    model.fc1.weight.register_hook(clamp_grad)
    model.fc1.weight.requires_grad_(False)
    g = peakcut.capture(model, data(0), loss_fn, "adamw")
    assert not any("fc1.weight" in n for n in g.signature.notes)


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers(), *state)]


def step_in_backward(p: torch.Tensor) -> None:
    """An optimizer stepped in the backward, as torch's 'optimizer in backward' recipe does."""
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
        p.grad = None


@pytest.mark.parametrize("optimizer", ["adamw", None])
def test_a_post_accumulate_grad_hook_is_refused_by_name(optimizer: str | None) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn(model, data(0)).backward()      # one step in, so there is state to leave alone
    opt.step()
    opt.zero_grad()
    model.fc2.weight.register_post_accumulate_grad_hook(step_in_backward)
    before = _snapshot(model, opt)
    with pytest.raises(peakcut.CaptureError, match=r"parameter 'fc2\.weight' has a post-accumulate-grad hook "
                       r"\(step_in_backward, registered with register_post_accumulate_grad_hook\).*never run"):
        peakcut.optimize(model, data(0), loss_fn, opt if optimizer else None, **SEARCH)
    after = _snapshot(model, opt)
    assert len(opt.state) == len(list(model.parameters())) and len(after) == len(before)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_inference_traces_forward_hooks_and_notes_no_backward_hook() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    model.fc1.register_forward_hook(rescale_output)
    model.norm.register_full_backward_hook(clamp_grad_input)       # no backward: never runs
    model.fc2.weight.register_post_accumulate_grad_hook(step_in_backward)
    x = data(0)[0]
    g = peakcut.capture(model, (x,), None, None)
    assert [n.split(":")[0] for n in g.signature.notes] == ["forward hook rescale_output on module 'fc1' (Linear)"]
    with torch.no_grad():
        torch.testing.assert_close(peakcut.build(g)(model, (x,)), model(x), rtol=0, atol=0)
