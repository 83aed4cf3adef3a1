"""Capture: an nn.Module + example batch (+ loss + optimizer) -> peakcut Graph.

One training step (forward, loss, backward, optimizer update) is traced with
make_fx over FakeTensors, so paper-size models trace without their memory.
Op set: the ATen ops eager PyTorch dispatches (after its implicit
decompositions), in-place ops included; see docs/ir.md for why not Core ATen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

from peakcut.capture.convert import fx_to_graph
from peakcut.capture.optimizers import (
    SGD,
    AdamW,
    OptimizerSpec,
    apply_update,
    init_state,
    parse_optimizer,
    spec_to_dict,
)
from peakcut.capture.trace import CaptureError, TraceLog, new_fake_mode, trace_step
from peakcut.ir.graph import Graph, StepSignature
from peakcut.ir.node import Phase
from peakcut.ir.tensor import Role

__all__ = ["SGD", "AdamW", "CaptureError", "OptimizerSpec", "capture"]

LossFn = Callable[[Any, Any], torch.Tensor]


class BoundModel:
    """Calls `model` with substituted parameters/buffers (functional_call); forwards attributes."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        self._model = model
        self._state = state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self._model, self._state, args, kwargs, strict=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _fake_like(fake_mode: Any, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A FakeTensor with t's layout: from a real tensor, a meta tensor, or an existing fake one."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor):
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if t.device.type == "meta":
        with fake_mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return fake_mode.from_tensor(t.detach())


def _model_device(model: torch.nn.Module, batch_leaves: Sequence[torch.Tensor], device: Any) -> torch.device:
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            # FakeTensors on CUDA abort the process on a CPU-only PyTorch build
            raise ValueError(f"device={device!r}: this PyTorch has no usable CUDA device; capture with "
                             "device='cpu' (CPU kernels decide output dtypes and workspaces) or on a GPU machine")
        return dev
    for t in (*model.parameters(), *model.buffers(), *batch_leaves):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def capture(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: LossFn | None = None,
    optimizer: str | OptimizerSpec | torch.optim.Optimizer | None = None,
    *,
    device: str | torch.device | None = None,
    keep_grads: bool = False,
) -> Graph:
    """Trace one step of `model` on `batch` into a Graph.

    - loss_fn(model, batch) -> scalar loss; None traces inference of model(*batch).
    - optimizer: "sgd" (momentum 0.9), "adamw", an SGD/AdamW spec, a torch.optim.SGD/AdamW,
      or None (the step then returns the loss and the gradients, like loss.backward()).
    - device: where the step will run, for models built on the meta device (default: the
      model's device, else cpu).
    - keep_grads: with an optimizer, also return the gradients (for checking; costs memory).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    spec = parse_optimizer(optimizer)
    if spec is not None and loss_fn is None:
        raise ValueError("an optimizer needs a loss_fn(model, batch) -> scalar loss")
    batch_leaves, batch_spec = pytree.tree_flatten(batch)
    for i, leaf in enumerate(batch_leaves):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"batch leaf {i} is a {type(leaf).__name__}; only tensors are supported")
    dev = _model_device(model, batch_leaves, device)
    mode = "inference" if loss_fn is None else ("train" if spec is not None else "grad")

    param_items = list(model.named_parameters(remove_duplicate=True))
    buffer_items = list(model.named_buffers(remove_duplicate=True))
    frozen: set[str] = set()
    while True:  # parameters that get no gradient are re-traced as frozen (torch.optim skips them)
        traced = _trace(model, param_items, buffer_items, batch_leaves, batch_spec, loss_fn, spec, mode,
                        dev, frozen)
        unused = traced.unused_params()
        if not unused:
            break
        frozen |= unused
    gm, log, output_info, input_names, roles, train_names = (
        traced.gm, traced.log, traced.output_info, traced.input_names, traced.roles, traced.train_names)

    if mode == "inference":
        n_out = len([n for n in gm.graph.nodes if n.op == "output"][0].args[0])
        out_names = [f"out:{i}" for i in range(n_out)]
        out_roles = [Role.ACTIVATION] * n_out
        keep = [True] * n_out
        out_spec = pytree.treespec_dumps(output_info["spec"])
    else:
        used_names = [n for n, u in zip(train_names, output_info["used"], strict=True) if u]
        out_names = ["loss", *[f"grad:{n}" for n in used_names]]
        out_roles = [Role.ACTIVATION, *[Role.GRAD] * len(used_names)]
        keep = [True, *[spec is None or keep_grads] * len(used_names)]
        out_spec = ""
    signature = StepSignature(
        batch_spec=pytree.treespec_dumps(batch_spec), output_spec=out_spec,
        optimizer=spec_to_dict(spec), mode=mode,
    )
    return fx_to_graph(gm, input_names, roles, out_names, out_roles, keep, log, str(dev), signature)


@dataclass
class _Traced:
    gm: torch.fx.GraphModule
    log: TraceLog
    output_info: dict[str, Any]
    input_names: list[str]
    roles: list[Role]
    train_names: list[str]

    def unused_params(self) -> set[str]:
        used = self.output_info.get("used", [])
        return {n for n, u in zip(self.train_names, used, strict=True) if not u}


def _trace(model: torch.nn.Module, param_items: list, buffer_items: list, batch_leaves: list,
           batch_spec: Any, loss_fn: LossFn | None, spec: OptimizerSpec | None, mode: str,
           dev: torch.device, frozen: set[str]) -> _Traced:
    """make_fx of one step; parameters named in `frozen` get no gradient and no update."""
    trainable = [p.requires_grad and mode != "inference" and n not in frozen for n, p in param_items]

    fake_mode = new_fake_mode()
    params = [_fake_like(fake_mode, p, dev) for _, p in param_items]
    buffers = [_fake_like(fake_mode, b, dev) for _, b in buffer_items]
    fbatch = [_fake_like(fake_mode, t, dev) for t in batch_leaves]
    train_params = [p for p, tr in zip(params, trainable, strict=True) if tr]
    train_names = [n for (n, _), tr in zip(param_items, trainable, strict=True) if tr]
    with fake_mode:
        slots, shared = init_state(spec, train_params) if spec is not None else ([], [])
    flat_slots = [t for per in slots for t in per]

    log = TraceLog()
    output_info: dict[str, Any] = {}

    def step(params, buffers, flat_slots, shared, leaves):  # traced
        log.set_phase(Phase.FORWARD)
        live = [p.detach().requires_grad_() if tr else p for p, tr in zip(params, trainable, strict=True)]
        state = {n: p for (n, _), p in zip(param_items, live, strict=True)}
        state.update({n: b for (n, _), b in zip(buffer_items, buffers, strict=True)})
        bound = BoundModel(model, state)
        b = pytree.tree_unflatten(list(leaves), batch_spec)
        if mode == "inference":
            with torch.no_grad():
                out = bound(*b) if isinstance(b, (tuple, list)) else bound(b)
            out_leaves, out_spec = pytree.tree_flatten(out)
            output_info["spec"] = out_spec
            return [o.detach() if isinstance(o, torch.Tensor) else o for o in out_leaves]
        # The traced tensors stay bound on the module through the backward too:
        # activation checkpointing re-runs forward code inside the backward.
        with _reparametrize_module(model, state, tie_weights=True, strict=False):
            loss = loss_fn(bound, b)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise CaptureError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                                   f"{tuple(getattr(loss, 'shape', ()))}")
            _hook_backward_meta(loss)
            log.set_phase(Phase.BACKWARD)
            live_train = [p for p, tr in zip(live, trainable, strict=True) if tr]
            grads = torch.autograd.grad(loss, live_train, allow_unused=True)
        output_info["used"] = [g is not None for g in grads]
        if spec is not None:
            log.set_phase(Phase.OPTIMIZER)
            n_slots = len(spec.slots())
            groups = [list(flat_slots[i * n_slots:(i + 1) * n_slots]) for i in range(len(grads))]
            targets = [p for p, tr in zip(params, trainable, strict=True) if tr]
            used = [i for i, g in enumerate(grads) if g is not None]
            with torch.no_grad():
                apply_update(
                    spec, [targets[i] for i in used], [grads[i] for i in used],
                    [groups[i] for i in used], list(shared),
                )
        return [loss.detach(), *[g for g in grads if g is not None]]

    input_names = (
        [f"param:{n}" for n, _ in param_items]
        + [f"buffer:{n}" for n, _ in buffer_items]
        + [f"state:{n}.{s}" for n in train_names for s in (spec.slots() if spec else ())]
        + [f"state:{s}" for s in (spec.shared_slots() if spec else ())]
        + [f"batch:{i}" for i in range(len(batch_leaves))]
    )
    roles = (
        [Role.PARAM] * len(params) + [Role.BUFFER] * len(buffers)
        + [Role.OPT_STATE] * (len(flat_slots) + len(shared)) + [Role.INPUT] * len(fbatch)
    )
    # make_fx flattens the nested arguments in this same order
    gm = trace_step(step, (params, buffers, flat_slots, shared, fbatch), model, log)
    return _Traced(gm, log, output_info, input_names, roles, train_names)



def _hook_backward_meta(loss: torch.Tensor) -> None:
    """Make backward ops carry the seq_nr of their forward op (module attribution)."""
    try:
        from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    except ImportError:  # older/newer torch: backward nodes then stay unattributed
        return
    if loss.grad_fn is not None:
        setup_stacktrace_preservation_hooks([loss.grad_fn])
