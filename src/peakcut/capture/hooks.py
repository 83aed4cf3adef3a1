"""The hooks a user registered on the model and its parameters: traced, carried over, or refused.

Capture runs the model's forward and backward under make_fx, so every hook PyTorch calls
there is traced into the step like the model's own code: module forward, forward-pre and
backward hooks (full or not), and the global ones (torch.nn.modules.module.register_module_*).
Their tensor operations run at every step; their Python code runs only while capturing.

Hooks on the parameters themselves need help: the trace differentiates stand-ins for the
parameters, not the user's Parameter objects, so `p.register_hook` hooks are registered again
on the stand-ins (parameter_hooks, register_parameter_hooks).
`p.register_post_accumulate_grad_hook` hooks cannot run (the step never accumulates into the
parameters' .grad) and are refused by name. Capture lists every hook it traced in the
graph's notes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.modules.module as module_hooks

from peakcut.capture.errors import CaptureError

_TRACED = "traced into the step: its tensor operations run at every step, its Python code ran only at capture"


def hook_name(fn: Any) -> str:
    """A readable name of a hook: its qualified name (`partial(f)` for a functools.partial)."""
    if isinstance(fn, functools.partial):
        return f"partial({hook_name(fn.func)})"
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _where(model: torch.nn.Module, path: str, module: torch.nn.Module) -> str:
    if not path:
        return f"the model ({type(model).__name__})"
    return f"module '{path}' ({type(module).__name__})"


def _backward_kind(full: bool | None) -> str:
    return "full backward hook" if full else "backward hook (register_backward_hook)"


def _module_hooks(model: torch.nn.Module) -> Iterator[tuple[str, str, bool, Callable[..., Any]]]:
    """(kind, where, acts on gradients, hook) for each hook registered on a module of `model`
    or on all modules."""
    full = module_hooks._global_is_full_backward_hook
    tables: list[tuple[str, str, bool, Mapping[int, Callable[..., Any]]]] = [
        ("forward pre-hook", "forward_pre_hook", False, module_hooks._global_forward_pre_hooks),
        ("forward hook", "forward_hook", False, module_hooks._global_forward_hooks),
        ("full backward pre-hook", "full_backward_pre_hook", True, module_hooks._global_backward_pre_hooks),
        (_backward_kind(full), "full_backward_hook" if full else "backward_hook", True,
         module_hooks._global_backward_hooks),
    ]
    for kind, registered, backward, table in tables:
        for fn in table.values():
            yield f"global {kind}", f"every module (register_module_{registered})", backward, fn
    for path, module in model.named_modules():
        where = _where(model, path, module)
        for kind, backward, table in (
            ("forward pre-hook", False, module._forward_pre_hooks),
            ("forward hook", False, module._forward_hooks),
            ("full backward pre-hook", True, module._backward_pre_hooks),
            (_backward_kind(module._is_full_backward_hook), True, module._backward_hooks),
        ):
            for fn in table.values():
                yield kind, where, backward, fn


def _tensor_hooks(t: torch.Tensor, attribute: str) -> list[Callable[..., Any]]:
    table = getattr(t, attribute, None)
    return list(table.values()) if table else []


def check_hooks(model: torch.nn.Module, *, trains: bool) -> list[str]:
    """Refuse (CaptureError) the hooks a captured step cannot run; a note for each one it traces.
    trains: the step has a backward (without one, as in eager inference, no hook on gradients runs)."""
    notes = [f"{kind} {hook_name(fn)} on {where}: {_TRACED}"
             for kind, where, backward, fn in _module_hooks(model) if trains or not backward]
    if not trains:
        return notes
    for name, p in model.named_parameters(remove_duplicate=True):
        refused = _tensor_hooks(p, "_post_accumulate_grad_hooks")
        if refused:
            names = ", ".join(hook_name(fn) for fn in refused)
            raise CaptureError(
                f"parameter '{name}' has a post-accumulate-grad hook ({names}, registered with "
                "register_post_accumulate_grad_hook): a captured step differentiates stand-ins for the "
                "parameters and never accumulates into the parameters' .grad, so the hook would never "
                "run; remove it (an optimizer stepped in the backward: give peakcut the optimizer instead)")
        if p.requires_grad:      # hooks on a frozen parameter never run, in eager either
            notes += [f"tensor hook {hook_name(fn)} on parameter '{name}': registered on the traced "
                      f"parameter, so it is {_TRACED}" for fn in _tensor_hooks(p, "_backward_hooks")]
    return notes


def parameter_hooks(params: Sequence[torch.Tensor], trainable: Sequence[bool]) -> list[list[Callable[..., Any]]]:
    """Each parameter's `register_hook` hooks, in their order (none where it is not trained).
    Read before the trace: under it, reading a real tensor's attributes counts as reading it."""
    return [_tensor_hooks(p, "_backward_hooks") if tr else [] for p, tr in zip(params, trainable, strict=True)]


def register_parameter_hooks(live: Sequence[torch.Tensor], hooks: Sequence[Sequence[Callable[..., Any]]]) -> None:
    """Register the parameters' hooks (parameter_hooks) on the tensors the trace differentiates in
    their place (`live`), so they act on the traced gradients as on the parameters' in eager."""
    for stand_in, fns in zip(live, hooks, strict=True):
        for fn in fns:
            stand_in.register_hook(fn)
