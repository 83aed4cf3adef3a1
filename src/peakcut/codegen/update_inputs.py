"""A step's update inputs, taken from the user's objects at every call.

The optimizer state is the user's: `state:<param>.<slot>` inputs are the tensors in
`optimizer.state[p]`, created exactly as torch.optim creates them on a parameter's
first step; Adam's per-parameter `step` stays in the state dict and is advanced after
the program ran, as torch.optim does (with fused=True it is an input the program advances
before the fused kernel reads it). Hyper-parameters are read from
`optimizer.param_groups` (spec.scalars). A GradScaler's scale is an input;
its found_inf output decides whether the update happened (state made for this step is
removed again, step counts stay) and feeds `GradScaler`'s own scale update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import _get_scalar_dtype

from peakcut.codegen.swap import host_copy, host_empty_strided
from peakcut.ir.ops import HOST_DEVICE
from peakcut.spec.fully_sharded import local_tensor
from peakcut.spec.optimizers import SUPPORTED, GroupSpec, OptimizerSpec, describe
from peakcut.spec.scalars import scalars


class StepBindingError(ValueError):
    """The model, batch, optimizer or scaler given to a step does not match what was captured."""


@dataclass
class Prepared:
    """What one call needs and what it must do afterwards."""

    hp: dict[str, float] = field(default_factory=dict)
    created: list[tuple[torch.Tensor, str]] = field(default_factory=list)   # (param, slot) made now
    advanced: list[torch.Tensor] = field(default_factory=list)             # Adam step tensors


class UpdateInputs:
    """Binds a captured update to a torch.optim optimizer (and GradScaler) at run time."""

    def __init__(self, spec: OptimizerSpec | None, grad_scaler: bool,
                 host_state: frozenset[str] = frozenset()) -> None:
        """host_state: the 'state:<param>.<slot>' inputs the plan keeps in host memory between
        steps (Graph.host_inputs): created there, and moved there when found on the device
        (e.g. after optimizer.load_state_dict, which puts state beside its parameter)."""
        self.spec = spec
        self.grad_scaler = grad_scaler
        self.host_state = host_state
        self._kept: dict[tuple[int, str], torch.Tensor] = {}   # (id(param), slot) -> host buffer
        self.device: torch.device | None = None    # the step's device (a parameter may be in host memory)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: Any = None

    # ------------------------------------------------------------------ objects
    def attach(self, optimizer: torch.optim.Optimizer | None, scaler: Any = None) -> None:
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer: expected a torch.optim optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"scaler: expected a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler

    def optimizer_for(self, model: torch.nn.Module) -> torch.optim.Optimizer | None:
        """The attached optimizer; a fresh one with the captured groups if none was given."""
        if self.spec is None:
            return None
        if self.optimizer is None:
            params = dict(model.named_parameters())
            missing = [n for g in self.spec.groups for n in g.params if n not in params]
            if missing:
                raise StepBindingError(f"model has no parameter named {missing[0]!r} (captured with one)")
            self.optimizer = self.spec.build(params)
        return self.optimizer

    def scaler_for(self, device: torch.device) -> Any:
        if not self.grad_scaler:
            return None
        if self.scaler is None:
            raise StepBindingError("this step was captured with a GradScaler: attach one (peakcut.optimize(..., "
                                   "scaler=), peakcut.load_plan(..., scaler=) or Step(..., scaler=))")
        if self.scaler._scale is None:
            self.scaler._lazy_init_scale_growth_tracker(device)
        return self.scaler

    # ------------------------------------------------------------------ per call
    def prepare(self, model: torch.nn.Module, accumulate: bool, returns_grads: set[str],
                params: Mapping[str, torch.Tensor] | None = None) -> Prepared:
        """Check the optimizer against the capture, create missing state, compute the scalars
        (`params`: model.named_parameters() as a dict, when the caller has it)."""
        spec = self.spec
        out = Prepared()
        opt = self.optimizer_for(model)
        if spec is None or opt is None:
            return out
        params = dict(model.named_parameters()) if params is None else params
        self._check_groups(opt, model, spec, params)
        steps: dict[str, float] = {}
        first: dict[str, bool] = {}
        for group in spec.groups:            # checks first: nothing is created for a refused call
            for name in group.params:
                if params[name].grad is not None and not accumulate and name not in returns_grads:
                    raise StepBindingError(
                        f"parameter {name!r} already has a .grad: plan.step computes the gradient of this batch "
                        "alone, as after optimizer.zero_grad(); call optimizer.zero_grad() (set_to_none=True, the "
                        "default) first, or plan with accumulate=k to add micro-batches")
        try:
            for group in spec.groups:
                for name in group.params:
                    self._state_of(opt, spec, group, name, params[name], out, steps, first)
            out.hp = scalars(spec, opt.param_groups, steps, first)
        except Exception:
            self.discard(out)
            raise
        return out

    def state_tensors(self, model: torch.nn.Module, params: Mapping[str, torch.Tensor] | None = None
                      ) -> dict[str, torch.Tensor]:
        """'state:<param>.<slot>' -> tensor for every state tensor the optimizer holds for the
        captured parameters (Adam's 'step' included)."""
        opt = self.optimizer
        if self.spec is None or opt is None:
            return {}
        params = dict(model.named_parameters()) if params is None else params
        found: dict[str, torch.Tensor] = {}
        for group in self.spec.groups:
            for name in group.params:
                for slot, value in opt.state.get(params[name], {}).items():
                    if isinstance(value, torch.Tensor):
                        found[f"state:{name}.{slot}"] = value
        return found

    def discard(self, prepared: Prepared) -> None:
        """Remove the state `prepare` created (the call failed, or a GradScaler skipped it)."""
        if self.optimizer is None:
            return
        for p, slot in prepared.created:
            state = self.optimizer.state.get(p)
            if state is not None:
                state.pop(slot, None)
                if not state:
                    self.optimizer.state.pop(p, None)
        prepared.created.clear()

    def finish(self, prepared: Prepared, found_inf: torch.Tensor | None) -> bool:
        """After the program ran: advance step counts, or undo this call's new state when a
        GradScaler skipped the update; update the scaler. Returns whether the update ran."""
        skipped = found_inf is not None and bool(found_inf.item())
        if skipped:
            self.discard(prepared)
        else:
            for step in prepared.advanced:
                step += 1
            if self.optimizer is not None:
                # what optimizer.step() sets for torch.optim.lr_scheduler ("step() before optimizer.step()")
                self.optimizer._opt_called = True  # type: ignore[attr-defined]
        if found_inf is not None:
            s = self.scaler
            torch._amp_update_scale_(s._scale, s._growth_tracker, found_inf.to(s._scale.device),
                                     s._growth_factor, s._backoff_factor, s._growth_interval)
        return not skipped

    # ------------------------------------------------------------------ helpers
    def _check_groups(self, opt: torch.optim.Optimizer, model: torch.nn.Module, spec: OptimizerSpec,
                      params: Mapping[str, torch.Tensor]) -> None:
        hooks = getattr(opt, "_optimizer_step_pre_hooks", {}) or getattr(opt, "_optimizer_step_post_hooks", {})
        if hooks:
            raise StepBindingError(f"{type(opt).__name__} has step hooks (register_step_pre_hook / post_hook): "
                                   "plan.step does not call optimizer.step(), so they would not run; remove them")
        if len(opt.param_groups) != len(spec.groups):
            raise StepBindingError(f"{type(opt).__name__} has {len(opt.param_groups)} param groups, the plan was "
                                   f"made for {len(spec.groups)}: plan again after changing the groups")
        try:
            live = describe(opt, model, params)
        except (TypeError, ValueError) as e:
            raise StepBindingError(f"the optimizer no longer matches the plan: {e}") from None
        if live.kind != spec.kind:
            raise StepBindingError(f"the plan updates like {spec.kind}, the optimizer is {type(opt).__name__} "
                                   f"({SUPPORTED} are supported): plan again with this optimizer")
        for gi, (was, now) in enumerate(zip(spec.groups, live.groups, strict=True)):
            missing = set(was.params) - set(now.params)
            if missing:
                raise StepBindingError(f"param group {gi} of {type(opt).__name__} no longer holds "
                                       f"{sorted(missing)[0]!r}, which the plan updates there")
            if _structure(was) != _structure(now):
                raise StepBindingError(
                    f"param group {gi}: {_what_changed(was, now)} changed since planning, which changes the "
                    "update's code (not just its numbers): plan again")

    def _state_of(self, opt: torch.optim.Optimizer, spec: OptimizerSpec, group: GroupSpec, name: str,
                  p: torch.Tensor, out: Prepared, steps: dict[str, float], first: dict[str, bool]) -> None:
        if spec.kind == "sgd":
            if group.hyper["momentum"] != 0:
                state = opt.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = self._zeros(name, "momentum_buffer", p)
                    out.created.append((p, "momentum_buffer"))
                    first[name] = True
                state["momentum_buffer"] = self._placed(name, "momentum_buffer", state["momentum_buffer"], p)
            return
        state = opt.state[p]
        fused = group.impl == "fused"
        moments = [slot for slot in spec.slots(group) if slot != "step"]
        if "step" not in state:
            # torch.optim: a float32 scalar beside the parameter for the fused kernel, else on the CPU
            state["step"] = (torch.zeros((), dtype=_get_scalar_dtype(is_fused=True), device=self._home(p)) if fused
                             else torch.tensor(0.0, dtype=_get_scalar_dtype()))
            out.created.append((p, "step"))
            for slot in moments:
                state[slot] = self._zeros(name, slot, p)
                out.created.append((p, slot))
        for slot in moments:
            if slot not in state:
                raise StepBindingError(f"optimizer state of {name!r} has no {slot!r} (saved without amsgrad?)")
            state[slot] = self._placed(name, slot, state[slot], p)
        step = state["step"]
        if fused:       # an input of the program, which advances it before the fused kernel reads it
            home = self._home(p)
            if step.dtype != _get_scalar_dtype(is_fused=True) or step.dim():
                raise StepBindingError(f"optimizer state {name}.step: {step.dtype} of {step.dim()} dims, the fused "
                                       "update reads a float32 scalar")
            if self._on_host(name, "step"):         # kept in host memory by the plan
                if self._kept.get((id(p), "step")) is not step:
                    step = state["step"] = self._kept[(id(p), "step")] = host_copy(step, pinned=home.type == "cuda")
            elif step.device != home:
                raise StepBindingError(f"optimizer state {name}.step is on {step.device}, the fused update reads "
                                       f"it on {home}")
            return
        steps[name] = (step + 1).item()       # torch.optim: step_t += 1; step = step_t.item()
        out.advanced.append(step)


    def _on_host(self, name: str, slot: str) -> bool:
        return f"state:{name}.{slot}" in self.host_state

    def _home(self, p: torch.Tensor) -> torch.device:
        """The device p's update runs on: the step's (p itself may be kept in host memory)."""
        return p.device if self.device is None else self.device

    def _zeros(self, name: str, slot: str, p: torch.Tensor) -> torch.Tensor:
        """New state for p, as torch.optim makes it; made in host memory (no device buffer
        first) when the plan keeps it there."""
        home = self._home(p)
        if not self._on_host(name, slot):
            return torch.zeros_like(p, memory_format=torch.preserve_format, device=home)
        local = local_tensor(p)        # an FSDP2 parameter's state is a DTensor like it: its shard kept
        kept = sharded_like(p, host_empty_strided(local.shape, local.stride(), p.dtype,
                                                  pinned=home.type == "cuda")[0].zero_())
        self._kept[(id(p), slot)] = kept
        return kept

    def _placed(self, name: str, slot: str, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The state tensor t, checked against p, in the memory the plan keeps it in. State the
        plan keeps in host memory lives in a host buffer apart from device memory (pinned when
        p is on CUDA; numpy-backed on CPU, outside the allocator that measurements see:
        codegen.swap); a tensor found elsewhere (new, or put back beside its parameter by
        optimizer.load_state_dict) is copied into one once."""
        on_host = self._on_host(name, slot)
        home = self._home(p)
        _check_like(name, slot, t, p, home, host_ok=on_host)
        key = (id(p), slot)
        if not on_host or self._kept.get(key) is t:
            return t
        kept = sharded_like(p, host_copy(local_tensor(t), pinned=home.type == "cuda"))
        self._kept[key] = kept
        return kept


def _structure(g: GroupSpec) -> tuple[Any, ...]:
    return g.structure()


def _what_changed(was: GroupSpec, now: GroupSpec) -> str:
    for key in ("weight_decay", "momentum"):
        if (was.hyper.get(key, 0) != 0) != (now.hyper.get(key, 0) != 0):
            return f"{key} ({was.hyper.get(key)} -> {now.hyper.get(key)}, zero <-> non-zero)"
    if was.impl != now.impl:
        return f"the update's implementation ({was.impl} -> {now.impl}: foreach=/fused= or the device)"
    return f"options {list(was.flags)} -> {list(now.flags)}"


def _check_like(name: str, slot: str, t: torch.Tensor, p: torch.Tensor, home: torch.device,
                host_ok: bool = False) -> None:
    """t has p's shape and dtype, and lives on the step's device `home` (or in host memory,
    when host_ok)."""
    placed = t.device == home or (host_ok and t.device.type == HOST_DEVICE)
    if t.shape != p.shape or t.dtype != p.dtype or not placed:
        raise StepBindingError(f"optimizer state {name}.{slot}: {tuple(t.shape)} {t.dtype} on {t.device}, the "
                               f"parameter is {tuple(p.shape)} {p.dtype} and the step runs on {home}")


def sharded_like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` as the shard of a DTensor placed as `p` is (an FSDP2 parameter's state), or
    `local` itself for a plain parameter."""
    if local_tensor(p) is p:
        return local
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        raise TypeError(f"a sharded parameter is a DTensor, got {type(p).__name__}")
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                              stride=p.stride())
