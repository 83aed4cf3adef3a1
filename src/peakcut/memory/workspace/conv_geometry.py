"""Convolution geometry and which CPU path ATen takes (oneDNN or the THNN slow kernels).

ConvGeometry is a convolution in forward-conv terms; `conv_backend` follows ATen's
ConvParams::use_mkldnn; the slow paths' im2col buffers and the `.contiguous` copies ATen
makes before calling a backend are here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.memory.workspace.call import nbytes, prod, round_up, suggest_memory_format
from peakcut.memory.workspace.machine import CpuMachine


@dataclass(frozen=True)
class ConvGeometry:
    """Convolution geometry in *forward conv* terms (for a transposed conv, roles are swapped by
    the caller): ``n`` images, ``ic``/``oc`` channels, spatial ``ins``/``outs``, kernel ``ks``."""

    n: int
    ic: int
    oc: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    ks: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    isz: int

    @property
    def ic_g(self) -> int:
        return self.ic // self.groups

    @property
    def oc_g(self) -> int:
        return self.oc // self.groups

    @property
    def k(self) -> int:
        return prod(self.ks)

    @property
    def in_sp(self) -> int:
        return prod(self.ins)

    @property
    def out_sp(self) -> int:
        return prod(self.outs)

    @property
    def strided(self) -> bool:
        return any(s > 1 for s in self.stride)

    @property
    def pointwise(self) -> bool:
        """1x1 kernel, no padding (oneDNN's 1x1 kernels)."""
        return self.k == 1 and all(p == 0 for p in self.padding)

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.ic_g == 1 and self.oc_g == 1

    def act(self, channels: int, spatial: int, isz: int | None = None) -> int:
        return self.n * channels * spatial * (self.isz if isz is None else isz)

    def weight_bytes(self) -> int:
        return self.oc * self.ic_g * self.k * self.isz


def ints(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    vals = tuple(int(x) for x in v)
    return vals * n if len(vals) == 1 and n > 1 else vals


def conv_geometry(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_spatial: Sequence[int]) -> ConvGeometry:
    """Forward-conv geometry of ``convolution(x, w)`` (not transposed)."""
    nsp = x.dim() - 2
    return ConvGeometry(
        n=x.shape[0], ic=x.shape[1], oc=w.shape[0], ins=tuple(x.shape[2:]), outs=tuple(out_spatial),
        ks=tuple(w.shape[2:]), stride=ints(a["stride"], nsp), padding=ints(a["padding"], nsp),
        dilation=ints(a["dilation"], nsp), groups=int(a["groups"]), isz=x.element_size(),
    )


def conv_out_spatial(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any]) -> tuple[int, ...]:
    nsp = x.dim() - 2
    st, pd, dl = ints(a["stride"], nsp), ints(a["padding"], nsp), ints(a["dilation"], nsp)
    if a.get("transposed"):
        op = ints(a.get("output_padding") or [0], nsp)
        return tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1
                     for i, s, p, d, k, o in zip(x.shape[2:], st, pd, dl, w.shape[2:], op, strict=True))
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, s, p, d, k in zip(x.shape[2:], st, pd, dl, w.shape[2:], strict=True))


def _use_mkldnn(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], machine: CpuMachine) -> bool:
    """ATen ConvParams::use_mkldnn (inputs of 3 dims are viewed as 4-d first)."""
    if not machine.onednn:
        return False
    nsp = x.dim() - 2
    stride, dilation = ints(a["stride"], nsp), ints(a["dilation"], nsp)
    if a.get("transposed"):
        op = ints(a.get("output_padding") or [0], nsp)
        if any(o >= s for o, s in zip(op, stride, strict=True)):
            return False
    if x.dtype == torch.bfloat16 and machine.avx512:
        return True
    if x.dtype != torch.float32:
        return False
    shape4 = list(x.shape) if x.dim() >= 4 else [x.shape[0], x.shape[1], 1, x.shape[2]]
    wshape = list(w.shape) if w.dim() >= 4 else [w.shape[0], w.shape[1], 1, w.shape[2]]
    kh, kw = wshape[-2], wshape[-1]
    strided = any(s != 1 for s in stride)
    dilated = any(d != 1 for d in dilation)
    first = strided or dilated or shape4[0] >= 16 or kw != 1 or kh != 1 or machine.threads > 1
    second = (int(a["groups"]) > 1 or (kw > 3 and kh > 3) or shape4[0] > 1
              or prod(shape4[:4]) > 20480)
    return first and second


def use_channels_last(x: torch.Tensor, w: torch.Tensor) -> bool:
    """mkldnn_conv_use_channels_last: input or weight suggests channels-last (not for float64)."""
    if x.dtype == torch.float64 or x.dim() not in (4, 5):
        return False
    return any(suggest_memory_format(t) != torch.contiguous_format for t in (x, w))


def cl_format(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def pad16(c: int) -> int:
    return round_up(c, 16)


def blocked_weight(g: ConvGeometry) -> int:
    """oneDNN blocked weight (16o16i, bf16 16i pairs): channels per group rounded up to 16."""
    return g.groups * pad16(g.oc_g) * pad16(g.ic_g) * g.k * g.isz


def first_conv(g: ConvGeometry) -> bool:
    """oneDNN's "first convolution" (plain src, ic < 16).  Not for 1x1 kernels: unpadded ones take
    the 1x1 kernel with blocked src (input channels padded to 16), padded ones the gemm kernel."""
    return g.groups == 1 and g.ic < 16 and g.k > 1


def fwd_kind(g: ConvGeometry) -> str:
    """oneDNN forward implementation for plain (NCHW) tensors, as oneDNN picks it on AVX-512."""
    if g.depthwise:
        return "dw"
    if g.groups > 1 and (g.ic_g % 16 or g.oc_g % 16):
        return "gemm"
    if g.k == 1 and not g.pointwise:
        return "gemm"  # 1x1 kernel with padding: no jit kernel takes it
    if first_conv(g):
        return "first"
    return "1x1" if g.pointwise else "direct"


def transposed_as_conv(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_sp: Sequence[int]) -> ConvGeometry:
    """A transposed conv (input x, weight [ic, oc/g, k]) as the forward conv it is the gradient of:
    conv input = the transposed conv's output, conv output = x."""
    nsp = x.dim() - 2
    groups = int(a["groups"])
    return ConvGeometry(
        n=x.shape[0], ic=w.shape[1] * groups, oc=x.shape[1], ins=tuple(out_sp), outs=tuple(x.shape[2:]),
        ks=tuple(w.shape[2:]), stride=ints(a["stride"], nsp), padding=ints(a["padding"], nsp),
        dilation=ints(a["dilation"], nsp), groups=groups, isz=x.element_size(),
    )


def slow_path_columns(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_sp: Sequence[int],
                       backend: str, transposed: bool) -> int:
    """im2col columns of the slow (THNN) convolution paths, forward and backward alike."""
    if transposed:
        g = transposed_as_conv(x, w, a, out_sp)
        return g.ic_g * g.k * prod(x.shape[2:]) * g.isz
    return _slow_columns(conv_geometry(x, w, a, out_sp), backend)


def _slow_columns(g: ConvGeometry, backend: str) -> int:
    """THNN im2col/col2im ``columns``: whole batch for slow_conv2d/3d, one image for the dilated and
    transposed kernels; none for 1x1 / stride 1 / no padding."""
    if g.k == 1 and not g.strided and all(p == 0 for p in g.padding) and backend != "slow_transpose":
        return 0
    per_image = g.ic_g * g.k * g.out_sp * g.isz
    return per_image * (g.n if backend in ("slow", "slow3d") else 1)


def conv_backend(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], machine: CpuMachine) -> str:
    if x.numel() == 0 or w.numel() == 0:
        return "empty"
    if _use_mkldnn(x, w, a, machine):
        return "mkldnn"
    if a.get("transposed"):
        return "slow_transpose"
    if x.dim() == 5:
        return "slow3d"
    nsp = x.dim() - 2
    return "slow_dilated" if any(d != 1 for d in ints(a["dilation"], nsp)) else "slow"


def slow_format(x: torch.Tensor, w: torch.Tensor, backend: str) -> torch.memory_format:
    """THNN slow_conv2d / dilated kernels run channels-last when input or weight is channels-last."""
    if backend in ("slow", "slow_dilated") and x.dim() == 4 and use_channels_last(x, w):
        return torch.channels_last
    return torch.contiguous_format


def input_copies(tensors: Iterable[torch.Tensor | None], fmt: torch.memory_format) -> int:
    """``.contiguous(memory_format)`` copies ATen makes before calling the backend."""
    total = 0
    for t in tensors:
        if t is None or t.dim() < 3:
            continue
        layout = fmt if t.dim() in (4, 5) else torch.contiguous_format
        if layout == torch.channels_last and t.dim() == 5:
            layout = torch.channels_last_3d
        if not t.is_contiguous(memory_format=layout):
            total += nbytes(t)
    return total
