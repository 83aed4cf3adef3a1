"""Gradient accumulation: one optimizer step over a batch run as k micro-batches.

- accumulation_step: the user's eager loop (forward, `(loss / k).backward()` per micro-batch,
  then one optimizer step and zero_grad), runnable on any device.
- accumulation_graph: the same step captured as a peakcut Graph over FakeTensors
  (peakcut.capture.capture_with_gradients): each micro-batch's forward and backward accumulate
  into the traced parameters' `.grad` as autograd does (the first micro-batch's gradient is
  kept, later ones are added in place), then peakcut's AdamW update runs once.

The effective batch is the same as eager's. The gradients equal eager's for a loss that is a
mean over equally sized micro-batches (ViT, GPT-Neo, BTLM: every sample or token counts); BERT's
masked-LM loss is a mean over each micro-batch's masked tokens, whose counts differ slightly;
BatchNorm models (ResNet-50, U-Net, U-Net++) normalise with each micro-batch's statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

from peakcut import Graph
from peakcut.capture import BoundModel, GroupSpec, OptimizerSpec, capture_with_gradients

LossFn = Callable[[Any, Any], torch.Tensor]
KS: tuple[int, ...] = (2, 4, 8)          # micro-batches per step in the tables
BATCHNORM_WORKLOADS: tuple[str, ...] = ("resnet50", "unet", "unetpp")
BATCHNORM_NOTE = "BatchNorm statistics per micro-batch (not exact)"


def has_batchnorm(model: torch.nn.Module) -> bool:
    """Whether the model normalises with batch statistics (accumulation then changes its numbers)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def micro_batches(batch: Any, k: int) -> list[Any]:
    """`batch` cut into k equal slices along dimension 0 of every tensor (views, no copy)."""
    leaves, spec = pytree.tree_flatten(batch)
    sizes = {t.shape[0] for t in leaves if isinstance(t, torch.Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"batch tensors disagree on their first dimension: {sorted(sizes)}")
    size = sizes.pop()
    if k < 1 or size % k:
        raise ValueError(f"a batch of {size} does not split into {k} equal micro-batches")
    m = size // k
    return [pytree.tree_unflatten([t[i * m:(i + 1) * m] if isinstance(t, torch.Tensor) else t
                                   for t in leaves], spec) for i in range(k)]


def accumulation_step(model: torch.nn.Module, batch: Any, loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                      k: int, mean_loss: bool = True) -> torch.Tensor:
    """One optimizer step over `batch` as k micro-batches; returns the step's loss (detached).

    Each micro-batch runs `loss_fn(model, micro_batch)` and `(loss / k).backward()` (a
    sum-reduced loss, `mean_loss=False`, is not scaled); then `optimizer.step()` and
    `optimizer.zero_grad(set_to_none=True)`. The returned loss is the mean (sum) of the
    micro-batches' losses.
    """
    scale = 1.0 / k if mean_loss else 1.0
    total: torch.Tensor | None = None
    for mb in micro_batches(batch, k):
        loss = loss_fn(model, mb)
        (loss * scale).backward()
        part = loss.detach() * scale
        total = part if total is None else total + part
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if total is None:
        raise ValueError("no micro-batch")
    return total


def default_spec(model: torch.nn.Module) -> OptimizerSpec:
    """torch.optim.AdamW with its defaults over every parameter that requires grad."""
    names = tuple(n for n, p in model.named_parameters(remove_duplicate=True) if p.requires_grad)
    hyper = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}
    return OptimizerSpec("adamw", (GroupSpec(names, hyper, ("decoupled_weight_decay",)),))


def spec_of(g: Graph) -> OptimizerSpec | None:
    """The update a captured step runs (its optimizer description)."""
    return OptimizerSpec.from_dict(g.signature.optimizer)


def accumulation_graph(model: torch.nn.Module, batch: Any, loss_fn: LossFn, k: int,
                       spec: OptimizerSpec | None = None, mean_loss: bool = True) -> Graph:
    """The k-micro-batch step of `model` (meta or real tensors) as a peakcut Graph.

    `spec`: the update (default: AdamW over every trainable parameter; `spec_of(eager graph)`
    updates the same parameters as eager's capture). The graph's output is the mean loss.
    """
    spec = spec or default_spec(model)
    param_items = list(model.named_parameters(remove_duplicate=True))
    buffer_names = [n for n, _ in model.named_buffers(remove_duplicate=True)]
    trainable = [p.requires_grad for _, p in param_items]
    scale = 1.0 / k if mean_loss else 1.0
    _, batch_spec = pytree.tree_flatten(batch)

    def gradients(params: list[torch.Tensor], buffers: list[torch.Tensor],
                  leaves: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        live = [p.detach().requires_grad_() if tr else p for p, tr in zip(params, trainable, strict=True)]
        state = {n: p for (n, _), p in zip(param_items, live, strict=True)}
        state.update(zip(buffer_names, buffers, strict=True))
        bound = BoundModel(model, state, buffer_names)
        full = pytree.tree_unflatten(list(leaves), batch_spec)
        total: torch.Tensor | None = None
        # bound through the backward too: checkpointed blocks recompute inside it
        with _reparametrize_module(model, state, tie_weights=True, strict=False):
            for mb in micro_batches(full, k):
                loss = loss_fn(bound, mb)
                (loss * scale).backward()
                part = loss.detach() * scale
                total = part if total is None else total + part
                del loss
        if total is None:
            raise ValueError("no micro-batch")
        return total, [p.grad if tr else None for p, tr in zip(live, trainable, strict=True)]

    return capture_with_gradients(model, batch, gradients, spec)
