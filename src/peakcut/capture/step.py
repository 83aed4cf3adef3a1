"""capture(): checks what the user's code holds, traces one step (again, with the parameters
that got no gradient frozen, until every trainable one gets one), names the step's outputs,
and returns the Graph with capture's control edges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.utils import _pytree as pytree

from peakcut.capture.control_edges import (
    chain_random,
    gate_updates,
    updates_after_guards,
    updates_after_loss,
)
from peakcut.capture.convert import fx_to_graph
from peakcut.capture.distributed import check_distributed
from peakcut.capture.errors import CaptureError
from peakcut.capture.fully_sharded import fsdp_hooks_removed, waits_in_place
from peakcut.capture.hooks import check_hooks
from peakcut.capture.inputs import check_inputs
from peakcut.capture.module_state import tensors_restored
from peakcut.capture.sparse import quiet_sparse_meta_failures, traced_sparse
from peakcut.capture.specialize import Specializer, record_counts
from peakcut.capture.training_step import LossFn, StepOptions, Traced, trace_training_step
from peakcut.capture.update import substitute_hypers
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, StepSignature
from peakcut.ir.tensor import Role
from peakcut.spec.data_parallel import DataParallelSpec
from peakcut.spec.fully_sharded import FullyShardedSpec, local_tensor
from peakcut.spec.optimizers import OptimizerSpec, describe, resolve_optimizer


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
    data_parallel: DataParallelSpec | None = None,
    fully_sharded: FullyShardedSpec | None = None,
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
    - data_parallel: `model` is the module a DistributedDataParallel wraps
      (spec.data_parallel.describe_data_parallel): the step broadcasts rank 0's buffers and
      all-reduces the gradients in DDP's buckets, as DDP does (capture.data_parallel).
    - fully_sharded: `model` is an FSDP2 module (spec.fully_sharded.describe_fully_sharded):
      the step takes each parameter's local shard, all-gathers it where it is used and
      reduce-scatters its gradient, as fully_shard's hooks do (capture.fully_sharded).
    """
    if fully_sharded is not None:
        with fsdp_hooks_removed(model):
            return _capture(model, batch, loss_fn, optimizer, device=device, keep_grads=keep_grads,
                            max_grad_norm=max_grad_norm, grad_scaler=grad_scaler, accumulate=accumulate,
                            data_parallel=data_parallel, fully_sharded=fully_sharded)
    return _capture(model, batch, loss_fn, optimizer, device=device, keep_grads=keep_grads,
                    max_grad_norm=max_grad_norm, grad_scaler=grad_scaler, accumulate=accumulate,
                    data_parallel=data_parallel, fully_sharded=None)


def _capture(model: torch.nn.Module, batch: Any, loss_fn: LossFn | None, optimizer: Any, *,
             device: str | torch.device | None, keep_grads: bool, max_grad_norm: float | None,
             grad_scaler: bool, accumulate: bool, data_parallel: DataParallelSpec | None,
             fully_sharded: FullyShardedSpec | None) -> Graph:
    """capture() once fully_shard's hooks are off the modules."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    check_distributed(model, data_parallel=data_parallel is not None, fully_sharded=fully_sharded is not None)
    if (data_parallel is not None or fully_sharded is not None) and (accumulate or loss_fn is None or keep_grads):
        raise ValueError(f"{'FSDP2' if fully_sharded is not None else 'DistributedDataParallel'}: peakcut plans "
                         "a multi-rank training step with a loss_fn, without gradient accumulation and "
                         "without keep_grads")
    hook_notes = check_hooks(model, trains=loss_fn is not None)   # refuses what cannot run; notes the rest
    check_inputs(model, batch, trains=loss_fn is not None, sharded=fully_sharded is not None)     # the batch's, parameters' and buffers' kinds
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
    if grad_scaler and spec is not None and any(g.impl == "fused" for g in spec.groups):
        raise ValueError("a GradScaler with fused=True is not supported: GradScaler.step hands the scale and "
                         "found_inf to the fused kernel, which unscales inside it, not as GradScaler.unscale_ "
                         "does; use foreach=True (or fused=False) with a GradScaler")
    batch_leaves, batch_spec = pytree.tree_flatten(batch)
    dev = _model_device(model, batch_leaves, device)
    mode = "inference" if loss_fn is None else ("train" if spec is not None else "grad")
    options = StepOptions(spec, mode, None if max_grad_norm is None else float(max_grad_norm), grad_scaler,
                          accumulate, data_parallel, fully_sharded)

    param_items = [(n, _local_parameter(p) if fully_sharded is not None else p)
                   for n, p in model.named_parameters(remove_duplicate=True)]
    buffer_items = list(model.named_buffers(remove_duplicate=True))
    frozen: set[str] = set()
    specializer: Specializer | None = None
    lower_sparse = False
    while True:  # parameters that get no gradient are re-traced as frozen (torch.optim skips them)
        try:
            # a forward's tensors stored on a module were fake; a CSR matrix's failed fake kernel is not logged
            with tensors_restored(model), quiet_sparse_meta_failures():
                traced = trace_training_step(model, param_items, buffer_items, batch_leaves, batch_spec, loss_fn,
                                             options, dev, frozen, specializer, lower_sparse)
        except CaptureError as e:       # traced again: specialised on values, or over sparse matrices' parts
            data_dependent = isinstance(e.__cause__, DynamicOutputShapeException)
            if data_dependent and specializer is None:
                specializer = Specializer(record_counts(model, batch, loss_fn, e))
                continue
            if data_dependent or lower_sparse:
                raise
            lower_sparse = True     # a sparse matrix built in the step fails a plain trace
            continue
        if not lower_sparse and traced_sparse(traced.gm):
            lower_sparse = True
            continue
        unused = traced.unused_params()
        if not unused:
            break
        frozen |= unused
    gm, log, input_names, roles = traced.gm, traced.log, traced.input_names, traced.roles
    substitute_hypers(gm, traced.hypers)
    waits_in_place(gm)
    log.notes.extend(hook_notes)
    if specializer is not None:
        log.notes.extend(specializer.notes())

    updated = set(traced.updated)
    out_names, out_roles, keep, out_spec = _outputs(traced, options, keep_grads)
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
        gate_updates(edit)
    updates_after_loss(edit)
    updates_after_guards(edit)
    chain_random(edit)
    return edit.finish()


def _local_parameter(p: torch.Tensor) -> torch.Tensor:
    """An FSDP2 parameter's local shard, marked as trainable as the parameter is (the shard
    itself never requires grad; the step differentiates stand-ins for it)."""
    return local_tensor(p).detach().requires_grad_(p.requires_grad)


def _outputs(traced: Traced, options: StepOptions, keep_grads: bool
             ) -> tuple[list[str], list[Role], list[bool], str]:
    """The step's outputs: their names, roles, which ones the step returns, and the spec of
    an inference step's output tree ('' for a training step)."""
    mode, spec, output_info = options.mode, options.spec, traced.output_info
    if mode == "inference":
        n_out = len([n for n in traced.gm.graph.nodes if n.op == "output"][0].args[0])
        return ([f"out:{i}" for i in range(n_out)], [Role.ACTIVATION] * n_out, [True] * n_out,
                pytree.treespec_dumps(output_info["spec"]))
    updated = set(traced.updated)
    used_names = [n for n, u in zip(traced.train_names, output_info["used"], strict=True) if u]
    out_names = ["loss", *[f"grad:{n}" for n in used_names]]
    out_roles = [Role.ACTIVATION, *[Role.GRAD] * len(used_names)]
    # gradients of parameters the optimizer does not update are returned (stored in p.grad)
    keep = [True, *[spec is None or keep_grads or n not in updated for n in used_names]]
    if options.grad_scaler and mode == "train":       # without an update there is nothing to skip
        out_names.append("found_inf")
        out_roles.append(Role.ACTIVATION)
        keep.append(True)
    if options.max_grad_norm is not None and mode == "train":     # the norm clip_grad_norm_ returns
        out_names.append("grad_norm")
        out_roles.append(Role.ACTIVATION)
        keep.append(True)
    return out_names, out_roles, keep, ""


def _recorded(spec: OptimizerSpec | None, updated: set[str]) -> dict[str, Any]:
    """The spec as recorded in the graph: each group lists the parameters the step updates."""
    if spec is None:
        return {}
    groups = tuple(replace(g, params=tuple(n for n in g.params if n in updated)) for g in spec.groups)
    return OptimizerSpec(spec.kind, groups).to_dict()
