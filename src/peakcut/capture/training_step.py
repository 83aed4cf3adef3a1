"""The step make_fx traces: fake parameters, buffers, optimizer slots and batch in; the
forward, the loss, the backward and the optimizer's update of the user's model run on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

from peakcut.capture.backward import gradients
from peakcut.capture.binding import BoundModel
from peakcut.capture.constants import ClosedOver
from peakcut.capture.data_parallel import ReadyOrder, all_reduced, broadcast_buffers, bucket_names
from peakcut.capture.errors import CaptureError
from peakcut.capture.fully_sharded import averaged, gathered, global_norm
from peakcut.capture.hooks import parameter_hooks, register_parameter_hooks
from peakcut.capture.sparse import SparseLowering
from peakcut.capture.specialize import Specializer
from peakcut.capture.trace import TraceLog, new_fake_mode, trace_step
from peakcut.capture.update import HyperTable, clip_by_total_norm, slot_like, traced_update, unscale
from peakcut.ir.node import Phase
from peakcut.ir.tensor import Role
from peakcut.spec.data_parallel import DataParallelSpec
from peakcut.spec.fully_sharded import FullyShardedSpec
from peakcut.spec.optimizers import OptimizerSpec

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class StepOptions:
    """What the traced step does besides the forward: the optimizer, the mode ('inference',
    'grad' or 'train'), the clip, a GradScaler, gradient accumulation, DDP's or FSDP2's collectives."""

    spec: OptimizerSpec | None
    mode: str
    max_grad_norm: float | None
    grad_scaler: bool
    accumulate: bool
    data_parallel: DataParallelSpec | None = None
    fully_sharded: FullyShardedSpec | None = None


@dataclass
class Traced:
    """One trace of the step: the FX graph and what names and roles its inputs have."""

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


def _fake_like(fake_mode: Any, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A FakeTensor with t's layout: from a real tensor, a meta tensor, or an existing fake one."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor):
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if t.device.type == "meta":
        with fake_mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return fake_mode.from_tensor(t.detach())


def trace_training_step(model: torch.nn.Module, param_items: list, buffer_items: list, batch_leaves: list,
                        batch_spec: Any, loss_fn: LossFn | None, options: StepOptions, dev: torch.device,
                        frozen: set[str], specializer: Specializer | None = None,
                        lower_sparse: bool = False) -> Traced:
    """make_fx of one step; parameters named in `frozen` get no gradient and no update; data-dependent
    sizes take the counts `specializer` recorded (capture.specialize); `lower_sparse`: sparse
    matrices built in the step are captured over their parts (capture.sparse)."""
    spec, mode, dp, fs = options.spec, options.mode, options.data_parallel, options.fully_sharded
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
        slots = [slot_like(by_name[n], slot) for n, slot in slot_names]
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
        if fs is not None:          # FSDP2: the module runs on parameters gathered from the shards
            state = {n: gathered(p, n, fs) for n, p in state.items()}
        if dp is not None and dp.sync_buffers and mode != "inference":
            broadcast_buffers(buffers, dp)
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
            ready = ReadyOrder(live_train, train_names) if dp is not None else None
            grads = gradients(target, live_train)
        output_info["used"] = [g is not None for g in grads]
        if fs is not None:
            grads = averaged(grads, fs)
        if ready is not None and dp is not None:        # DDP: averaged over the ranks, in buckets
            ready.remove()
            produced = {n: g for n, g in zip(train_names, grads, strict=True) if g is not None}
            order = [n for n in dict.fromkeys(ready.names) if n in produced]
            reduced = all_reduced(produced, bucket_names(order, by_name, dp), dp)
            grads = [reduced.get(n) for n in train_names]
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
                    found_inf = unscale(ordered, scale[0], log)
                    extra.append(found_inf)
                if options.max_grad_norm is not None:
                    norm = clip_by_total_norm(ordered, options.max_grad_norm, log,
                                              None if fs is None else (lambda n: global_norm(n, fs)))
                    extra.append(torch.zeros((), device=dev) if norm is None else norm)
                if scale:
                    torch.ops.peakcut.skip_update_if(found_inf)
                slot_map: dict[str, dict[str, torch.Tensor]] = {n: {} for n in updated}
                for (n, slot), t in zip(slot_names, slots, strict=True):
                    slot_map[n][slot] = t
                targets = {n: p for (n, _), p in zip(param_items, params, strict=True)}
                traced_update(spec, {n: targets[n] for n in updated}, got, slot_map, hypers, log)
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
    traced = closed.around(SparseLowering().around(step) if lower_sparse else step)
    gm = trace_step(traced, (params, buffers, slots, accs, scale, fbatch), model, log, dev,
                    specializer.decompositions(log) if specializer is not None else None)
    for name, note in closed.lift(gm):      # tensors read besides the inputs: 'const:' inputs after them
        input_names.append(name)
        roles.append(Role.BUFFER)
        log.notes.append(note)
    return Traced(gm, log, output_info, input_names, roles, train_names, updated, hypers)


def _hook_backward_meta(loss: torch.Tensor) -> None:
    """Make backward ops carry the seq_nr of their forward op (module attribution)."""
    try:
        from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    except ImportError:  # older/newer torch: backward nodes then stay unattributed
        return
    if loss.grad_fn is not None:
        setup_stacktrace_preservation_hooks([loss.grad_fn])
