"""Capture: an nn.Module + example batch (+ loss + optimizer) -> peakcut Graph.

One training step (forward, loss, backward, optimizer update) is traced with
make_fx over FakeTensors, so paper-size models trace without their memory.
Op set: the ATen ops eager PyTorch dispatches (after its implicit
decompositions), in-place ops included; see docs/ir.md for why not Core ATen.

What the user's code holds is checked first (inputs.py: the kinds of batch, parameters and
buffers; hooks.py; distributed.py) and honoured while tracing: trace.py runs make_fx (its
generator-state calls through rng.py), backward.py differentiates, constants.py lifts
closed-over tensors, module_state.py undoes what a forward stored on its modules;
convert.py turns the FX graph into a Graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

from peakcut.capture.backward import gradients
from peakcut.capture.constants import ClosedOver
from peakcut.capture.convert import fx_to_graph
from peakcut.capture.distributed import check_distributed
from peakcut.capture.hooks import check_hooks, parameter_hooks, register_parameter_hooks
from peakcut.capture.inputs import check_inputs
from peakcut.capture.module_state import persist_rebound_buffers, tensors_restored
from peakcut.capture.optimizers import (
    SGD,
    Adam,
    AdamW,
    GroupSpec,
    OptimizerSpec,
    describe,
    resolve_optimizer,
)
from peakcut.capture.trace import CaptureError, TraceLog, new_fake_mode, trace_step
from peakcut.capture.update import (
    HyperTable,
    clip_by_total_norm,
    substitute_hypers,
    traced_update,
    unscale,
)
from peakcut.capture.with_gradients import capture_with_gradients
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, StepSignature
from peakcut.ir.node import Phase
from peakcut.ir.ops import GATE_OP
from peakcut.ir.registry import draws_random
from peakcut.ir.tensor import Role

__all__ = ["SGD", "Adam", "AdamW", "BoundModel", "CaptureError", "GroupSpec", "OptimizerSpec", "capture",
           "capture_with_gradients", "describe_optimizer"]

LossFn = Callable[[Any, Any], torch.Tensor]


class BoundModel:
    """The model as a traced loss_fn sees it: calls `model` with substituted parameters and
    buffers (as torch.func.functional_call does) and forwards attribute reads to it. A buffer
    named in `buffers` that the forward assigns a new tensor to gets its value in place."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor], buffers: Sequence[str] = ()) -> None:
        self._model = model
        self._state = state
        self._buffers = {n: state[n] for n in buffers}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _reparametrize_module(self._model, self._state, tie_weights=True, strict=False):
            out = self._model(*args, **kwargs)
            persist_rebound_buffers(self._model, self._buffers)    # `self.ema = ...` kept, in place
        return out

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


def describe_optimizer(model: torch.nn.Module, optimizer: Any) -> OptimizerSpec | None:
    """The OptimizerSpec that capture records for `optimizer` (None, a name, a recipe or a
    torch.optim optimizer) on `model`; raises a clear error for what is not supported."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = resolve_optimizer(optimizer, trainable)
    return None if opt is None else describe(opt, model)


def capture(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: LossFn | None = None,
    optimizer: Any = None,
    *,
    device: str | torch.device | None = None,
    keep_grads: bool = False,
    max_grad_norm: float | None = None,
    grad_scaler: bool = False,
    accumulate: bool = False,
) -> Graph:
    """Trace one step of `model` on `batch` into a Graph.

    - loss_fn(model, batch) -> scalar loss; None traces inference of model(*batch).
    - optimizer: a torch.optim.SGD / Adam / AdamW (any param groups; its hyper-parameters
      become run-time inputs read at every step), "sgd" (momentum 0.9), "adam", "adamw", a
      peakcut.SGD / Adam / AdamW recipe, or None (the step then returns the loss and the
      gradients, like loss.backward()).
    - device: where the step will run, for models built on the meta device (default: the
      model's device, else cpu).
    - keep_grads: with an optimizer, also return the gradients (for checking; costs memory).
    - max_grad_norm: clip the optimizer's gradients by global 2-norm first, exactly as
      torch.nn.utils.clip_grad_norm_ (norms in model parameter order).
    - grad_scaler: a torch.amp.GradScaler drives the step: the loss is multiplied by the
      'scaler:scale' input, gradients are unscaled, and the update is skipped when one is inf/nan.
    - accumulate: the optimizer's gradients are added to 'acc:<param>' inputs (the p.grad of
      earlier micro-batches) before clipping and the update.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    check_distributed(model)
    hook_notes = check_hooks(model, trains=loss_fn is not None)   # refuses what cannot run; notes the rest
    check_inputs(model, batch, trains=loss_fn is not None)     # the batch's, parameters' and buffers' kinds
    spec = describe_optimizer(model, optimizer) if loss_fn is not None or optimizer is None else None
    if optimizer is not None and loss_fn is None:
        raise ValueError("an optimizer needs a loss_fn(model, batch) -> scalar loss")
    if max_grad_norm is not None:
        if spec is None:
            raise ValueError("max_grad_norm needs an optimizer (the clip comes right before the update)")
        if not isinstance(max_grad_norm, (int, float)) or not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={max_grad_norm!r}: expected a number > 0")
    if accumulate and spec is None:
        raise ValueError("accumulate needs an optimizer (without one, plan.step already adds into p.grad)")
    if grad_scaler and loss_fn is None:
        raise ValueError("a GradScaler needs a loss_fn")
    batch_leaves, batch_spec = pytree.tree_flatten(batch)
    dev = _model_device(model, batch_leaves, device)
    mode = "inference" if loss_fn is None else ("train" if spec is not None else "grad")
    options = _Options(spec, mode, None if max_grad_norm is None else float(max_grad_norm), grad_scaler,
                       accumulate)

    param_items = list(model.named_parameters(remove_duplicate=True))
    buffer_items = list(model.named_buffers(remove_duplicate=True))
    frozen: set[str] = set()
    while True:  # parameters that get no gradient are re-traced as frozen (torch.optim skips them)
        with tensors_restored(model):      # a forward's tensors stored on a module were fake
            traced = _trace(model, param_items, buffer_items, batch_leaves, batch_spec, loss_fn, options, dev,
                            frozen)
        unused = traced.unused_params()
        if not unused:
            break
        frozen |= unused
    gm, log, output_info, input_names, roles, train_names = (
        traced.gm, traced.log, traced.output_info, traced.input_names, traced.roles, traced.train_names)
    substitute_hypers(gm, traced.hypers)
    log.notes.extend(hook_notes)

    updated = set(traced.updated)
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
        # gradients of parameters the optimizer does not update are returned (stored in p.grad)
        keep = [True, *[spec is None or keep_grads or n not in updated for n in used_names]]
        if grad_scaler and mode == "train":       # without an update there is nothing to skip
            out_names.append("found_inf")
            out_roles.append(Role.ACTIVATION)
            keep.append(True)
        out_spec = ""
    signature = StepSignature(
        batch_spec=pytree.treespec_dumps(batch_spec), output_spec=out_spec,
        optimizer=_recorded(spec, updated), mode=mode, max_grad_norm=options.max_grad_norm,
        grad_scaler=grad_scaler, accumulate=accumulate,
        requires_grad=tuple(n for n, p in param_items if p.requires_grad) if mode != "inference" else (),
    )
    g = fx_to_graph(gm, input_names, roles, out_names, out_roles, keep, log, str(dev), signature)
    edit = GraphEditor(g)
    edit.set_signature(replace(g.signature, notes=tuple(log.notes)))
    if grad_scaler and mode == "train":
        _gate_updates(edit)
    _updates_after_loss(edit)
    _chain_random(edit)
    return edit.finish()


@dataclass(frozen=True)
class _Options:
    spec: OptimizerSpec | None
    mode: str
    max_grad_norm: float | None
    grad_scaler: bool
    accumulate: bool


def _recorded(spec: OptimizerSpec | None, updated: set[str]) -> dict[str, Any]:
    """The spec as recorded in the graph: each group lists the parameters the step updates."""
    if spec is None:
        return {}
    groups = tuple(type(g)(tuple(n for n in g.params if n in updated), g.hyper, g.flags) for g in spec.groups)
    return OptimizerSpec(spec.kind, groups).to_dict()


@dataclass
class _Traced:
    gm: torch.fx.GraphModule
    log: TraceLog
    output_info: dict[str, Any]
    input_names: list[str]
    roles: list[Role]
    train_names: list[str]
    updated: list[str]
    hypers: HyperTable

    def unused_params(self) -> set[str]:
        used = self.output_info.get("used", [])
        return {n for n, u in zip(self.train_names, used, strict=True) if not u}


def _trace(model: torch.nn.Module, param_items: list, buffer_items: list, batch_leaves: list,
           batch_spec: Any, loss_fn: LossFn | None, options: _Options, dev: torch.device,
           frozen: set[str]) -> _Traced:
    """make_fx of one step; parameters named in `frozen` get no gradient and no update."""
    spec, mode = options.spec, options.mode
    trainable = [p.requires_grad and mode != "inference" and n not in frozen for n, p in param_items]
    train_names = [n for (n, _), tr in zip(param_items, trainable, strict=True) if tr]
    group_of = spec.group_of() if spec is not None else {}
    updated = [n for n in train_names if n in group_of]     # the optimizer's parameters with a gradient
    slot_names = [(n, slot) for n in updated for slot in spec.slots(spec.groups[group_of[n]])] if spec else []

    fake_mode = new_fake_mode()
    params = [_fake_like(fake_mode, p, dev) for _, p in param_items]
    buffers = [_fake_like(fake_mode, b, dev) for _, b in buffer_items]
    fbatch = [_fake_like(fake_mode, t, dev) for t in batch_leaves]
    by_name = {n: p for (n, _), p in zip(param_items, params, strict=True)}
    with fake_mode:
        slots = [torch.zeros_like(by_name[n], memory_format=torch.preserve_format) for n, _ in slot_names]
        accs = ([torch.zeros_like(by_name[n], memory_format=torch.preserve_format) for n in updated]
                if options.accumulate else [])
        scale = [torch.full((), 65536.0, dtype=torch.float32, device=dev)] if options.grad_scaler else []

    log = TraceLog()
    output_info: dict[str, Any] = {}
    hypers = HyperTable()
    hooks = parameter_hooks([p for _, p in param_items], trainable)    # read before the trace

    def step(params, buffers, slots, accs, scale, leaves):  # traced
        log.set_phase(Phase.FORWARD)
        live = [p.detach().requires_grad_() if tr else p for p, tr in zip(params, trainable, strict=True)]
        register_parameter_hooks(live, hooks)      # the parameters' p.register_hook hooks
        state = {n: p for (n, _), p in zip(param_items, live, strict=True)}
        state.update({n: b for (n, _), b in zip(buffer_items, buffers, strict=True)})
        bound = BoundModel(model, state, [n for n, _ in buffer_items])
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
            loss_out = loss.detach()    # taken here, so a GradScaler's early return has it
            target = loss * scale[0] if scale else loss      # GradScaler.scale(loss)
            log.set_phase(Phase.BACKWARD)
            live_train = [p for p, tr in zip(live, trainable, strict=True) if tr]
            grads = gradients(target, live_train)
        output_info["used"] = [g is not None for g in grads]
        extra: list[torch.Tensor] = []
        if spec is not None and mode == "train":
            log.set_phase(Phase.OPTIMIZER)
            by_train = dict(zip(train_names, grads, strict=True))
            with torch.no_grad():
                got = {n: by_train[n] for n in updated if by_train[n] is not None}
                if accs:
                    got = {n: acc.add_(got[n]) for n, acc in zip(updated, accs, strict=True) if n in got}
                ordered = [got[n] for n in updated if n in got]
                if scale:
                    found_inf = unscale(ordered, scale[0])
                    extra.append(found_inf)
                if options.max_grad_norm is not None:
                    clip_by_total_norm(ordered, options.max_grad_norm)
                if scale:
                    torch.ops.peakcut.skip_update_if(found_inf)
                slot_map: dict[str, dict[str, torch.Tensor]] = {n: {} for n in updated}
                for (n, slot), t in zip(slot_names, slots, strict=True):
                    slot_map[n][slot] = t
                targets = {n: p for (n, _), p in zip(param_items, params, strict=True)}
                traced_update(spec, {n: targets[n] for n in updated}, got, slot_map, hypers)
        return [loss_out, *[g for g in grads if g is not None], *extra]

    input_names = (
        [f"param:{n}" for n, _ in param_items]
        + [f"buffer:{n}" for n, _ in buffer_items]
        + [f"state:{n}.{s}" for n, s in slot_names]
        + [f"acc:{n}" for n in updated[:len(accs)]]
        + ["scaler:scale"] * len(scale)
        + [f"batch:{i}" for i in range(len(batch_leaves))]
    )
    roles = (
        [Role.PARAM] * len(params) + [Role.BUFFER] * len(buffers) + [Role.OPT_STATE] * len(slots)
        + [Role.ACCUMULATED] * len(accs) + [Role.OPT_STATE] * len(scale) + [Role.INPUT] * len(fbatch)
    )
    closed = ClosedOver(fake_mode, log, model, loss_fn, dev, param_items, buffer_items)
    # make_fx flattens the nested arguments in this same order
    gm = trace_step(closed.around(step), (params, buffers, slots, accs, scale, fbatch), model, log, dev)
    for name, note in closed.lift(gm):      # tensors read besides the inputs: 'const:' inputs after them
        input_names.append(name)
        roles.append(Role.BUFFER)
        log.notes.append(note)
    return _Traced(gm, log, output_info, input_names, roles, train_names, updated, hypers)


def _chain_random(edit: GraphEditor) -> None:
    """Calls that draw random numbers keep their capture order (control edges between them), so
    any schedule draws the same masks from the generator as the eager step (DESIGN invariant 4)."""
    g = edit.graph
    last: int | None = None
    for nid in g.order:
        node = g.nodes[nid]
        if draws_random(node.op, node.args, node.kwargs):
            if last is not None:
                edit.add_control(nid, [last])
            last = nid


def _input_storages(g: Graph, prefixes: tuple[str, ...]) -> set[int]:
    """Storages of the step's inputs whose names start with one of `prefixes`."""
    return {g.tensors[t].storage for t, name in zip(g.inputs, g.input_names, strict=True)
            if name.startswith(prefixes)}


def _gate_updates(edit: GraphEditor) -> None:
    """The GradScaler's gate (an early return when found_inf) runs after everything the step
    returns or must do whatever it finds (the outputs, buffer updates), and every write of a
    parameter or of optimizer state runs after it."""
    g = edit.graph
    gates = [n.id for n in g.nodes.values() if n.op == GATE_OP]
    if not gates:
        return
    gate = gates[0]
    owned = _input_storages(g, ("param:", "state:"))
    buffers = _input_storages(g, ("buffer:", "const:"))
    for t in g.outputs:
        producer = g.producer(t)
        if producer is not None and producer != gate:
            edit.add_control(gate, [producer])
    for node in list(g.nodes.values()):
        if node.id == gate:
            continue
        written = {g.tensors[t].storage for t in node.mutated_ids()}
        if node.phase is Phase.OPTIMIZER and written & owned:
            edit.add_control(node.id, [gate])
        elif written & buffers:
            edit.add_control(gate, [node.id])


def _updates_after_loss(edit: GraphEditor) -> None:
    """Every write of a parameter or of optimizer state runs after the loss, as in the eager
    loop: a step that fails on its batch (a label out of range, a NaN check in the model)
    then leaves the model and optimizer untouched. Without these edges a schedule may hoist
    the parts of an update that need no gradient (AdamW's weight decay, beta2 * exp_avg_sq)
    into the forward; those writes are in place, so the order costs no memory."""
    g = edit.graph
    loss = g.producer(g.outputs[0]) if g.outputs and g.output_names[0] == "loss" else None
    if loss is None:
        return
    owned = _input_storages(g, ("param:", "state:"))
    for node in list(g.nodes.values()):
        if node.phase is Phase.OPTIMIZER and node.id != loss and owned & {
                g.tensors[t].storage for t in node.mutated_ids()}:
            edit.set_control(node.id, sorted({*g.control.get(node.id, ()), loss}))   # ids ascending, as capture's


def _hook_backward_meta(loss: torch.Tensor) -> None:
    """Make backward ops carry the seq_nr of their forward op (module attribution)."""
    try:
        from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    except ImportError:  # older/newer torch: backward nodes then stay unattributed
        return
    if loss.grad_fn is not None:
        setup_stacktrace_preservation_hooks([loss.grad_fn])
