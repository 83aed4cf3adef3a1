"""Captured layouts are the real layouts (peakcut.capture.real_layouts).

A fake kernel that keeps a strided input's layout, where the real kernel returns a
contiguous result, made capture trace a reshape of the result as a view the real result
cannot take. Found by bench.fuzz (seeds 2171 and 2314 of the 400-case run at moves 5: a
LayerNorm between two transposes); the shrunk case is kept here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import peakcut
from bench.fuzz.blocks import MixTokens
from peakcut.capture.real_layouts import real_layout_table
from peakcut.runtime.equivalence import check_equivalence, rounding_tolerance

aten = torch.ops.aten


def _traced_strides(f: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], x: torch.Tensor) -> list[tuple[int, ...]]:
    gm = make_fx(f, tracing_mode="fake", decomposition_table=real_layout_table())(x)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a.meta["val"].stride() for a in out.args[0]]


def _layer_norm_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    w, b = torch.ones(x.shape[-1]), torch.zeros(x.shape[-1])
    _, mean, rstd = aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
    return aten.native_layer_norm_backward(x * 2, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])


def _layer_norm(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return aten.native_layer_norm(x, [x.shape[-1]], torch.ones(x.shape[-1]), torch.zeros(x.shape[-1]), 1e-5)


def _log_softmax_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (aten._log_softmax_backward_data(x * 2, x.log_softmax(1), 1, x.dtype),)


def _softmax_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (aten._softmax_backward_data(x * 2, x.softmax(1), 1, x.dtype),)


def _gelu_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (aten.gelu_backward(x * 2, x),)


def _batch_norm(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = x.shape[1]
    return aten.native_batch_norm(x, torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c), True, 0.1, 1e-5)


def _batch_norm_legit(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = x.shape[1]
    return aten._native_batch_norm_legit(x, torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c), True,
                                         0.1, 1e-5)


def _batch_norm_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = x.shape[1]
    w, rm, rv = torch.ones(c), torch.zeros(c), torch.ones(c)
    _, mean, invstd = aten.native_batch_norm(x, w, None, rm, rv, True, 0.1, 1e-5)
    return aten.native_batch_norm_backward(x * 2, x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True])


def _batch_norm_backward_no_input_grad(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A frozen layer before the norm: no input gradient asked for (the real kernel returns
    None for it; a copy of it must not be traced). Found by bench.fuzz seed 11."""
    c = x.shape[1]
    w, rm, rv = torch.ones(c), torch.zeros(c), torch.ones(c)
    _, mean, invstd = aten.native_batch_norm(x, w, None, rm, rv, True, 0.1, 1e-5)
    return aten.native_batch_norm_backward(x * 2, x, w, rm, rv, mean, invstd, True, 1e-5, [False, True, True])[1:]


def _max_pool_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if x.dim() != 4:
        return (x * 1,)
    out, idx = aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
    return (aten.max_pool2d_with_indices_backward(out * 2, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx),)


def _conv_backward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if x.dim() != 4:
        return (x * 1,)
    c = x.shape[1]
    w = torch.randn(c, c, 3, 3)
    out = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return aten.convolution_backward(out, x, w, [c], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])[:2]


KERNELS = [_layer_norm_backward, _log_softmax_backward, _batch_norm, _batch_norm_legit, _batch_norm_backward,
           _batch_norm_backward_no_input_grad, _layer_norm, _softmax_backward, _gelu_backward, _max_pool_backward, _conv_backward]
LAYOUTS = {
    "3-d transposed": lambda: torch.randn(2, 5, 6).transpose(1, 2),
    "4-d transposed": lambda: torch.randn(2, 6, 5, 4).transpose(2, 3),
    "4-d channels first and last swapped": lambda: torch.randn(2, 6, 5, 4).transpose(1, 3),
    "channels-last": lambda: torch.randn(2, 6, 4, 4).to(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("f", KERNELS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_traced_strides_are_the_real_kernels(f: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
                                              layout: str) -> None:
    torch.manual_seed(0)
    x = LAYOUTS[layout]()
    real = [t.stride() for t in f(x)]
    assert _traced_strides(f, x) == real


def test_the_batch_norm_copy_changes_no_number() -> None:
    """The traced batch norm backward runs on the strided input as eager does; only its
    result is copied (bitwise the eager kernel's numbers)."""
    x = torch.randn(4, 5, 6, dtype=torch.float32).transpose(1, 2)
    gm = make_fx(_batch_norm_backward, tracing_mode="fake", decomposition_table=real_layout_table())(x)
    for ours, eager in zip(gm(x), _batch_norm_backward(x), strict=True):
        assert torch.equal(ours, eager)


class MixNormMix(nn.Module):
    """The fuzz case, shrunk: a linear layer across the sequence (transposes on both sides),
    a LayerNorm of its transposed result, the same mixing again. The second mix's backward
    hands the norm a strided gradient; the first mix's backward reshapes the norm's input
    gradient, traced as a view."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm, self.head = nn.Linear(5, 8), nn.LayerNorm(8), nn.Linear(8, 3)
        self.mix1, self.mix2 = MixTokens(4), MixTokens(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix2(self.norm(self.mix1(self.stem(x))))).mean(1)


class BatchNormOverFeatures(nn.Module):
    """BatchNorm1d over a sequence's features, between two transposes (found in review)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm, self.head = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.stem(x).transpose(1, 2)).transpose(1, 2)).mean(1)


class FrozenStemBatchNorm(BatchNormOverFeatures):
    """The same with the layer before the norm frozen: its input gradient is not computed
    (the real kernel returns None; bench.fuzz seed 11 crashed on a copy of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem.requires_grad_(False)


class TransposedLogits(nn.Module):
    """cross_entropy over (B, C, T) logits that are a transpose: log_softmax's backward of a
    strided input, then a reshape of its gradient in the head's backward (this one ran
    before the fix too; it keeps the contiguous copies honest)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x).transpose(1, 2)


@pytest.mark.parametrize("model", [MixNormMix, BatchNormOverFeatures, FrozenStemBatchNorm, TransposedLogits],
                         ids=lambda m: m.__name__)
def test_a_strided_input_to_these_kernels_gives_eager_numbers(model: type[nn.Module]) -> None:
    torch.manual_seed(0)
    m = model().double()
    x = torch.randn(4, 4, 8 if model is TransposedLogits else 5, dtype=torch.float64)
    y = torch.randint(0, 3, (4, 4) if model is TransposedLogits else (4,))

    def loss_fn(mod: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(mod(b[0]), b[1])

    g = peakcut.capture(m, (x, y), loss_fn, peakcut.SGD(lr=0.1), keep_grads=True)
    tol = rounding_tolerance(torch.float64, 64, 2)
    report = check_equivalence(copy.deepcopy(m), (x, y), loss_fn, peakcut.SGD(lr=0.1),
                               lambda _m: peakcut.build(g), steps=2, rtol=tol, atol=tol)
    assert report.ok, str(report)
