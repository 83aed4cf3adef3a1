"""Normalization (batch, group, layer norm), softmax and dropout: statistics, partials, copies."""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

from peakcut.memory.workspace.call import (
    OpCall,
    Rule,
    contiguous_copy,
    nbytes,
    prod,
    suggest_memory_format,
)


def _acc_isz(dtype: torch.dtype) -> int:
    return 8 if dtype == torch.float64 else 4


def batch_norm(c: OpCall) -> int:
    """native_batch_norm / _native_batch_norm_legit{,_functional,_no_training}.

    Measured: two per-channel float buffers (mean/var sums in training, alpha/beta in eval):
    ``2 * C * 4`` (8 for float64).  Training on the channels-last kernel (input channels-last, or
    contiguous with H*W == 1) adds per-thread partial sums ``nthreads * C * 4``.
    """
    x = c.tensor("input")
    if x is None or x.dim() < 2:
        return 0
    channels, acc = x.shape[1], _acc_isz(x.dtype)
    base = 2 * channels * acc
    training = c.args.get("training", False) if c.family != "_native_batch_norm_legit_no_training" else False
    if not training:
        return base
    image = x.numel() // max(x.shape[0] * channels, 1)
    fmt = suggest_memory_format(x) if x.dim() in (4, 5) else torch.contiguous_format
    cl_kernel = fmt != torch.contiguous_format or image == 1
    return base + (c.threads * channels * acc if cl_kernel else 0)


def batch_norm_backward(c: OpCall) -> int:
    """native_batch_norm_backward: an input-sized buffer when grad_input is requested (measured)."""
    mask = c.args.get("output_mask") or [True, True, True]
    x = c.tensor("input")
    return nbytes(x) if mask[0] else 0


def group_norm(c: OpCall) -> int:
    """native_group_norm: the channels-last kernel keeps per (image, channel) float sums
    ``2 * N * C * 4``; contiguous inputs need nothing (measured, f32 and bf16)."""
    x = c.tensor("input")
    if x is None or x.dim() not in (4, 5) or suggest_memory_format(x) == torch.contiguous_format:
        return 0
    return 2 * x.shape[0] * x.shape[1] * _acc_isz(x.dtype)


def group_norm_backward(c: OpCall) -> int:
    """native_group_norm_backward: per (image, channel) float sums ``ds``/``db``: ``2 * N * C * 4``."""
    x = c.tensor("input")
    return 0 if x is None or x.dim() < 2 else 2 * x.shape[0] * x.shape[1] * _acc_isz(x.dtype)


def layer_norm(c: OpCall) -> int:
    """native_layer_norm: contiguous copies of a non-contiguous input / weight / bias (measured)."""
    return sum(contiguous_copy(c.tensor(n)) for n in ("input", "weight", "bias"))


def layer_norm_backward(c: OpCall) -> int:
    """native_layer_norm_backward.

    Measured: when grad_weight or grad_bias is requested, per-thread partial sums
    ``2 * nthreads * N * itemsize(input)`` (N = normalized numel), plus contiguous copies of
    non-contiguous grad_out / input / weight.
    """
    mask = c.args.get("output_mask") or [True, True, True]
    x = c.tensor("input")
    if x is None:
        return 0
    shape = c.args.get("normalized_shape") or []
    partials = 2 * c.threads * prod(shape) * x.element_size() if (mask[1] or mask[2]) else 0
    copies = sum(contiguous_copy(c.tensor(n)) for n in ("grad_out", "input", "weight"))
    return partials + copies


def softmax(c: OpCall) -> int:
    """_softmax / _log_softmax and their backward: contiguous copies of non-contiguous tensor inputs."""
    return sum(contiguous_copy(c.tensor(n)) for n in ("self", "grad_output", "output"))


def native_dropout(c: OpCall) -> int:
    """native_dropout(train=True): an input-sized noise tensor (``numel * itemsize``) (measured)."""
    x = c.tensor("input")
    train = c.args.get("train")
    return nbytes(x) if x is not None and (train is None or train) else 0


RULES: Mapping[str, Rule] = types.MappingProxyType({
    **dict.fromkeys(("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                     "_native_batch_norm_legit_no_training"), batch_norm),
    "native_batch_norm_backward": batch_norm_backward,
    "native_group_norm": group_norm,
    "native_group_norm_backward": group_norm_backward,
    "native_layer_norm": layer_norm,
    "native_layer_norm_backward": layer_norm_backward,
    **dict.fromkeys(("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"),
                    softmax),
    "native_dropout": native_dropout,
})
