"""The user's eager step and the state it runs from, kept and put back.

    eager = EagerStep(model, batch, loss_fn, optimizer, max_grad_norm)
    with Restore(model, optimizer, constants) as restore: ...   # everything as it was on entry

Verification and calibration run the user's own step (EagerStep) beside candidate plans and
must leave the model, the optimizer and its state, the constants the step binds and the RNG
as they found them (Restore); a candidate that moves parameters or optimizer state to host
memory when it binds is undone after each of its runs (Layout), so that eager never meets
them there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class EagerStep:
    """One step of the user's eager loop on `model` and `optimizer` (what plan.step stands for):
    grads set to None, loss, backward, clipping, optimizer.step(), grads set to None again."""

    def __init__(self, model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any],
                 optimizer: torch.optim.Optimizer | None, max_grad_norm: float | None) -> None:
        self.model, self.batch, self.loss_fn = model, batch, loss_fn
        self.optimizer, self.max_grad_norm = optimizer, max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self) -> torch.Tensor:
        return self.run()

    def run(self, keep_grads: bool = False) -> torch.Tensor:
        """The step; keep_grads leaves .grad as the step made it (the numbers check reads it)."""
        for p in self.params:
            p.grad = None
        loss = self.loss_fn(self.model, self.batch)
        loss.backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        if self.optimizer is not None:
            self.optimizer.step()
        if not keep_grads:
            for p in self.params:
                p.grad = None
        return loss.detach()


class Restore:
    """Parameters, buffers (non-persistent ones too), grads, optimizer state, the tensors the
    step closes over (`constants`: its `const:` inputs, which it may write in place) and the
    RNG as they were on entry: verification trains nothing. Snapshots are kept in host
    memory; the optimizer's state tensors are the same objects afterwards, holding their old
    values. put_back() restores all but the RNG at any time (the numbers check, between its
    runs)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 constants: Sequence[tuple[str, torch.Tensor]] = ()) -> None:
        self.model, self.optimizer, self.constants = model, optimizer, list(constants)
        device = model_device(model)
        self.rng = torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else [])

    def __enter__(self) -> Restore:
        self.rng.__enter__()
        self.named = [*((f"param:{n}", t) for n, t in self.model.named_parameters()),
                      *((f"buffer:{n}", t) for n, t in self.model.named_buffers()), *self.constants]
        self.saved = [t.detach().to("cpu", copy=True) for _, t in self.named]
        self.grads = [getattr(t, "grad", None) for _, t in self.named]
        self.state: dict[Any, dict[str, Any]] = {}
        self.values: dict[tuple[int, str], torch.Tensor] = {}
        if self.optimizer is not None:
            self.state = {p: dict(s) for p, s in self.optimizer.state.items()}
            self.values = {(id(p), k): v.detach().to("cpu", copy=True) for p, s in self.state.items()
                           for k, v in s.items() if isinstance(v, torch.Tensor)}
        return self

    def put_back(self) -> None:
        """The entry values in the entry tensors, the entry grads, the entry optimizer state."""
        with torch.no_grad():
            for (_, t), saved, grad in zip(self.named, self.saved, self.grads, strict=True):
                t.copy_(saved)
                if isinstance(t, torch.nn.Parameter):
                    t.grad = grad
            if self.optimizer is not None:
                self.optimizer.state.clear()
                for p, s in self.state.items():
                    for k, v in s.items():
                        if isinstance(v, torch.Tensor):
                            v.copy_(self.values[(id(p), k)])
                    self.optimizer.state[p] = dict(s)

    def entry(self) -> dict[str, torch.Tensor]:
        """The host snapshots by key: 'param:<name>', 'buffer:<name>', 'state:<param>.<slot>'."""
        found = {key: saved for (key, _), saved in zip(self.named, self.saved, strict=True)}
        names = {id(t): key.removeprefix("param:") for key, t in self.named if key.startswith("param:")}
        found.update({f"state:{names[i]}.{k}": v for (i, k), v in self.values.items() if i in names})
        return found

    @property
    def nbytes(self) -> int:
        """Host bytes of the snapshots."""
        return sum(t.numel() * t.element_size() for t in [*self.saved, *self.values.values()])

    def __exit__(self, *exc: object) -> None:
        try:
            self.put_back()
        finally:
            self.rng.__exit__(None, None, None)


class Layout:
    """Which tensors hold the model's parameters and the optimizer's state: a candidate that
    keeps some in host memory replaces them when it binds (p.data, optimizer.state[p][slot];
    codegen.program, codegen.update_inputs). put_back() copies their values into the tensors
    taken here and puts those back, so that eager and the next candidate run on the user's
    layout (on a GPU, eager would otherwise meet parameters in host memory)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.params = [(p, p.data) for p in model.parameters()]
        self.state = [] if optimizer is None else [
            (s, k, v) for s in optimizer.state.values() for k, v in s.items() if isinstance(v, torch.Tensor)]

    def put_back(self) -> None:
        with torch.no_grad():
            for p, data in self.params:
                if p.data_ptr() != data.data_ptr() or p.device != data.device:
                    data.copy_(p.detach())
                    p.data = data
            for s, k, v in self.state:
                now = s.get(k)
                if now is not v:
                    if isinstance(now, torch.Tensor):
                        v.copy_(now)
                    s[k] = v


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
