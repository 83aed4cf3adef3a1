"""Selective activation checkpointing as torchtitan's default (`SelectiveAC`) does it.

torchtitan (torchtitan/distributed/activation_checkpoint.py, `SelectiveAC`, the Trainer's
default `activation_checkpoint`) wraps every transformer block in a non-reentrant
`torch.utils.checkpoint` whose `context_fn` is
`create_selective_checkpoint_contexts(policy)`, with a fresh policy per block call:

- save set: the partitioner's compute-intensive ops (`get_default_op_list()
  .compute_intensive_ops`: mm, addmm, bmm, convolution, convolution_backward, SDPA/flash/
  efficient attention, _scaled_mm, upsample_bilinear2d), plus the SDPA math/cudnn/overrideable
  kernels, aten.max, flex attention, aten.linear, aten.topk and the collectives;
- every second aten.mm / aten.linear of a block (counted separately in the forward and in the
  recomputation) is recomputed instead (PREFER_RECOMPUTE); addmm and bmm outputs are always
  saved;
- a CUDA-to-CPU `_to_copy` is saved; everything else is recomputed.
The block is checkpointed with preserve_rng_state=True, determinism_check="default",
early_stop=False (torchtitan's ptd_checkpoint_wrapper defaults). Its per-fqn forced
recomputation (`force_recompute_mm_shapes_by_fqns`, default "moe.router.gate") matches no
module of these models.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

SOURCE = "torchtitan SelectiveAC (torchtitan/distributed/activation_checkpoint.py)"

# ops saved besides the partitioner's compute-intensive ones (paths under torch.ops; missing ones skipped)
_EXTRA_SAVE = (
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "aten.max.default",
    "aten.linear.default",
    "aten.topk.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_to_all_single.default",
)


def _resolve(path: str) -> Any | None:
    obj: Any = torch.ops
    try:
        for part in path.split("."):
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None
    return obj


def save_ops() -> frozenset[Any]:
    """The ops whose outputs the policy saves (subject to the every-second-mm rule)."""
    from torch._functorch.partitioners import get_default_op_list

    ops: set[Any] = {getattr(op, "default") for op in get_default_op_list().compute_intensive_ops}  # noqa: B009
    ops.update(op for op in map(_resolve, _EXTRA_SAVE) if op is not None)
    flex = getattr(torch._higher_order_ops, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    compiled = getattr(torch._higher_order_ops, "inductor_compiled_code", None)
    if compiled is not None:
        ops.add(compiled)
    return frozenset(ops)


def make_policy(saved: frozenset[Any]) -> Callable[..., CheckpointPolicy]:
    """A fresh policy for one checkpointed block call (its own mm counters)."""
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    count = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                and str(kwargs.get("device", "")) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            count[mode] += 1
        if func in saved:
            if func in mm_ops and count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def context_fn(saved: frozenset[Any] | None = None) -> Callable[[], Any]:
    """The `context_fn` of torch.utils.checkpoint for torchtitan's policy."""
    ops = save_ops() if saved is None else saved
    return lambda: create_selective_checkpoint_contexts(make_policy(ops))


def selectively_checkpointed(forward: Callable[..., Any], saved: frozenset[Any] | None = None) -> Callable[..., Any]:
    """`forward` run under torch.utils.checkpoint with torchtitan's selective policy."""
    make_context = context_fn(saved)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=make_context,
                          preserve_rng_state=True, determinism_check="default", early_stop=False, **kwargs)

    return run


@contextlib.contextmanager
def traced_as_eager() -> Iterator[None]:
    """Selective checkpointing under make_fx behaves as it does eagerly.

    torch.utils.checkpoint takes an active proxy mode for a compiler's trace: it then caches
    every op's output and leaves the save/recompute choice to the compiler's partitioner
    (node.meta["recompute"]). peakcut.capture's make_fx records the eager step, so inside this
    context the policy decides, as in eager: saved outputs are reused in the backward, the rest
    is recomputed there.
    """
    original = torch_checkpoint._is_compiling
    torch_checkpoint._is_compiling = lambda func, args, kwargs: False
    try:
        yield
    finally:
        torch_checkpoint._is_compiling = original
