"""Re-measure the CPU workspace model (peakcut.memory.workspace) against the real allocator.

For every case, one op call runs on real CPU tensors under ``torch.profiler`` with
``profile_memory=True``; the c10 CPU allocator's alloc/free events give the running sum, and

    measured transient = max(running sum during the call) - bytes of the outputs

where the outputs are those the op's meta kernel returns (an output that aliases an input costs
nothing; an output the real kernel returns but the meta kernel does not -- e.g. mkldnn's
grad_weight when only grad_bias is requested -- counts as transient).  The model is
``cpu_workspace_bytes`` on meta copies of the arguments.  Each call is warmed up once first
(oneDNN primitive creation allocates nothing through c10, but the warm-up keeps the window clean).

Usage::

    python bench/calibrate_workspace.py [--threads N] [--only SUBSTRING] [--no-graphs] [--all]

Prints ``op | shapes | measured | model | error``; rows marked ``~`` are rules documented as
approximate (oneDNN scratchpads), the others are expected within 2 % or 256 bytes.  With
``--graphs`` (default) it also traces a small CNN and a tiny BERT training step with make_fx
(Core ATen) and checks every op occurrence with a nonzero measurement or model.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from peakcut.memory.workspace import cpu_workspace_bytes
from peakcut.runtime import allocator_events, profiler_peak

aten = torch.ops.aten
TOLERANCE_BYTES = 256
TOLERANCE_REL = 0.02


@dataclass(frozen=True)
class Case:
    """One op call; ``make`` builds fresh real arguments (args, kwargs)."""

    label: str
    op: torch._ops.OpOverload
    make: Callable[[], tuple[tuple, dict]]
    approx: bool = False


@dataclass(frozen=True)
class Result:
    label: str
    op: str
    shapes: str
    measured: int
    model: int
    approx: bool

    @property
    def ok(self) -> bool:
        err = abs(self.model - self.measured)
        return err <= TOLERANCE_BYTES or err <= TOLERANCE_REL * max(self.measured, 1)


def to_meta(x: Any) -> Any:
    """Meta copy of a tensor (same shape, strides, dtype); devices become 'meta'."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def memory_events(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[list[int], Any]:
    """Signed sizes of the CPU allocator events during one call (in time order) and its result."""
    return allocator_events(lambda: op(*args, **kwargs))


def output_bytes(real_out: Any, meta_out: Any, args: tuple, kwargs: dict) -> int:
    """Bytes of the new storages among the outputs the meta kernel also returns."""
    inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
              if isinstance(t, torch.Tensor)}
    real, _ = tree_flatten(real_out)
    meta, _ = tree_flatten(meta_out)
    seen: set[int] = set()
    total = 0
    for r, m in zip(real, meta, strict=False):
        if not isinstance(r, torch.Tensor) or not isinstance(m, torch.Tensor):
            continue
        ptr = r.untyped_storage().data_ptr()
        if ptr in inputs or ptr in seen:
            continue
        seen.add(ptr)
        total += r.untyped_storage().nbytes()
    return total


def measure(op: torch._ops.OpOverload, args: tuple, kwargs: dict, warmup: int = 1) -> tuple[int, int]:
    """(measured transient, model) for one call on real CPU tensors."""
    meta_args, meta_kwargs = tree_map(to_meta, args), tree_map(to_meta, kwargs)
    meta_out = op(*meta_args, **meta_kwargs)
    model = cpu_workspace_bytes(op, meta_args, meta_kwargs,
                                [t for t in tree_flatten(meta_out)[0] if isinstance(t, torch.Tensor)])
    for _ in range(warmup):
        op(*args, **kwargs)
    peak, out = profiler_peak(lambda: op(*args, **kwargs))
    return peak - output_bytes(out, meta_out, args, kwargs), model


def describe(args: tuple, kwargs: dict) -> str:
    parts = []
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, torch.Tensor):
            dt = str(a.dtype).replace("torch.", "").replace("float", "f").replace("bfloat16", "bf16")
            cl = "CL" if a.dim() == 4 and not a.is_contiguous() and a.is_contiguous(
                memory_format=torch.channels_last) else ""
            parts.append(f"{dt}{list(a.shape)}{cl}")
    return " ".join(parts)[:70]


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------

R = torch.randn
CL = torch.channels_last


def _conv_cases() -> Iterator[Case]:
    # (N, C, H, OC, k, stride, pad, groups, dtype, channels_last, approx)
    cfgs = [
        (8, 64, 28, 64, 3, 1, 1, 1), (8, 64, 28, 128, 1, 1, 0, 1), (8, 64, 28, 128, 1, 2, 0, 1),
        (8, 3, 56, 64, 7, 2, 3, 1), (8, 24, 28, 24, 3, 1, 1, 1), (8, 64, 28, 100, 3, 1, 1, 1),
        (8, 8, 28, 8, 3, 1, 1, 1), (2, 512, 7, 512, 3, 1, 1, 1), (8, 16, 28, 32, 3, 2, 1, 1),
        (8, 64, 28, 64, 3, 1, 1, 64), (8, 64, 28, 64, 3, 2, 1, 64), (8, 64, 28, 64, 3, 1, 1, 32),
        (8, 64, 28, 64, 3, 1, 1, 4), (8, 128, 14, 256, 3, 2, 1, 1), (16, 64, 14, 64, 3, 1, 1, 1),
        (8, 256, 14, 64, 1, 1, 0, 1), (8, 64, 28, 64, 5, 1, 2, 1), (4, 3, 32, 16, 3, 1, 1, 1),
        (1, 16, 16, 32, 3, 1, 1, 1),
    ]
    for n, c, h, oc, k, s, p, g in cfgs:
        for dt, cl in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False)):
            if cl and g > 1:
                continue
            tag = f"conv k{k}s{s}g{g} {'bf16' if dt == torch.bfloat16 else 'f32'}{' CL' if cl else ''}"

            def make(n=n, c=c, h=h, oc=oc, k=k, s=s, p=p, g=g, dt=dt, cl=cl) -> tuple[tuple, dict]:
                x, w = R(n, c, h, h, dtype=dt), R(oc, c // g, k, k, dtype=dt)
                if cl:
                    x, w = x.to(memory_format=CL), w.to(memory_format=CL)
                return (x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g), {}

            strided_bwd = s > 1 and g == 1
            bf16 = dt == torch.bfloat16
            yield Case(tag, aten.convolution.default, make)

            def make_b(make=make, oc=oc, mask=(True, True, True)) -> tuple[tuple, dict]:
                (x, w, _, st, pd, dl, tr, op_, g_), _ = make()
                y = aten.convolution.default(x, w, None, st, pd, dl, tr, op_, g_)
                gy = torch.randn_like(y)
                return (gy, x, w, [oc], st, pd, dl, tr, op_, g_, list(mask)), {}

            yield Case(tag + " bwd", aten.convolution_backward.default, make_b,
                       approx=cl or bf16 or strided_bwd or g not in (1, c))
    yield Case("conv bwd mask 100", aten.convolution_backward.default, lambda: (
        (R(8, 64, 28, 28), R(8, 64, 28, 28), R(64, 64, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [True, False, False]), {}))
    yield Case("conv bwd mask 001", aten.convolution_backward.default, lambda: (
        (R(8, 64, 28, 28), R(8, 64, 28, 28), R(64, 64, 3, 3), [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [False, False, True]), {}))
    yield Case("conv bwd mask 010", aten.convolution_backward.default, lambda: (
        (R(8, 64, 28, 28), R(8, 64, 28, 28), R(64, 64, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [False, True, False]), {}))
    yield Case("conv bias", aten.convolution.default, lambda: (
        (R(8, 64, 28, 28), R(64, 64, 3, 3), R(64), [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}))
    yield Case("conv1d", aten.convolution.default, lambda: (
        (R(8, 64, 100), R(64, 64, 3), R(64), [1], [1], [1], False, [0], 1), {}))
    yield Case("conv3d", aten.convolution.default, lambda: (
        (R(2, 16, 8, 16, 16), R(32, 16, 3, 3, 3), None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1), {}))
    yield Case("conv dilated", aten.convolution.default, lambda: (
        (R(8, 64, 28, 28), R(64, 64, 3, 3), None, [1, 1], [2, 2], [2, 2], False, [0, 0], 1), {}))
    yield Case("conv f64 (thnn)", aten.convolution.default, lambda: (
        (R(8, 16, 28, 28, dtype=torch.float64), R(32, 16, 3, 3, dtype=torch.float64), None,
         [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}))
    yield Case("conv f64 (thnn) bwd", aten.convolution_backward.default, lambda: (
        (R(8, 32, 28, 28, dtype=torch.float64), R(8, 16, 28, 28, dtype=torch.float64),
         R(32, 16, 3, 3, dtype=torch.float64), [32], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]), {}))
    yield Case("conv non-contiguous input", aten.convolution.default, lambda: (
        (R(8, 28, 28, 64).permute(0, 3, 1, 2), R(64, 64, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}),
        approx=True)
    # 1x1 convs with ic < 16 run oneDNN's 1x1 kernel (blocked src), not the first-conv kernel; a
    # bias with oc % 16 is copied to a 16-padded scratch buffer; the 1x1 weight gradient books a
    # bias reducer (tiny U-Net output head: 8 -> 2 channels).
    yield Case("conv 1x1 oc2 bias", aten.convolution.default, lambda: (
        (R(2, 8, 32, 32), R(2, 8, 1, 1), R(2), [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}))
    yield Case("conv 1x1 oc2 bias bwd", aten.convolution_backward.default, lambda: (
        (R(2, 2, 32, 32), R(2, 8, 32, 32), R(2, 8, 1, 1), [2], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
         [True, True, True]), {}))
    yield Case("conv 1x1 ic3 stride 2 bias", aten.convolution.default, lambda: (
        (R(2, 3, 32, 32), R(24, 3, 1, 1), R(24), [2, 2], [0, 0], [1, 1], False, [0, 0], 1), {}))
    yield Case("conv 1x1 oc16 wgrad+bias", aten.convolution_backward.default, lambda: (
        (R(4, 16, 32, 32), R(4, 16, 32, 32), R(16, 16, 1, 1), [16], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
         [False, True, True]), {}))
    yield Case("conv 1x1 ic8 bf16 bias", aten.convolution.default, lambda: (
        (R(2, 8, 32, 32, dtype=torch.bfloat16), R(2, 8, 1, 1, dtype=torch.bfloat16), R(2, dtype=torch.bfloat16),
         [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}))
    # 1x1 kernels with padding run the gemm kernel.
    yield Case("conv 1x1 padded (gemm)", aten.convolution.default, lambda: (
        (R(2, 64, 16, 16), R(64, 64, 1, 1), R(64), [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}))
    yield Case("conv 1x1 padded (gemm) bwd", aten.convolution_backward.default, lambda: (
        (R(2, 64, 18, 18), R(2, 64, 16, 16), R(64, 64, 1, 1), [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [True, True, True]), {}))
    # First conv with 4 <= ic < 16: AVX2 weight-gradient kernel with cpu_reducer_t weight/bias reducers.
    yield Case("conv first ic8 wgrad+bias (avx2)", aten.convolution_backward.default, lambda: (
        (R(8, 8, 28, 28), R(8, 8, 28, 28), R(8, 8, 3, 3), [8], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [False, True, True]), {}))
    yield Case("conv first ic8 oc12 wgrad+bias (avx2)", aten.convolution_backward.default, lambda: (
        (R(2, 12, 32, 32), R(2, 8, 32, 32), R(12, 8, 3, 3), [12], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
         [False, True, True]), {}))
    # Transposed convs of the tiny U-Net (upsampling 2x2 stride 2).
    yield Case("convT s2 U-Net 64->32", aten.convolution.default, lambda: (
        (R(2, 64, 4, 4), R(64, 32, 2, 2), R(32), [2, 2], [0, 0], [1, 1], True, [0, 0], 1), {}), approx=True)
    yield Case("convT s2 U-Net 32->16", aten.convolution.default, lambda: (
        (R(2, 32, 8, 8), R(32, 16, 2, 2), R(16), [2, 2], [0, 0], [1, 1], True, [0, 0], 1), {}), approx=True)
    yield Case("convT s2 U-Net 16->8 bwd", aten.convolution_backward.default, lambda: (
        (R(2, 8, 32, 32), R(2, 16, 16, 16), R(16, 8, 2, 2), [8], [2, 2], [0, 0], [1, 1], True, [0, 0], 1,
         [True, True, True]), {}))
    yield Case("convT s1", aten.convolution.default, lambda: (
        (R(8, 64, 14, 14), R(64, 32, 3, 3), None, [1, 1], [1, 1], [1, 1], True, [0, 0], 1), {}))
    yield Case("convT s2", aten.convolution.default, lambda: (
        (R(8, 64, 14, 14), R(64, 32, 2, 2), None, [2, 2], [0, 0], [1, 1], True, [0, 0], 1), {}), approx=True)
    yield Case("convT s1 bwd", aten.convolution_backward.default, lambda: (
        (R(8, 32, 14, 14), R(8, 64, 14, 14), R(64, 32, 3, 3), [32], [1, 1], [1, 1], [1, 1], True, [0, 0], 1,
         [True, True, True]), {}), approx=True)


def _pointwise_cases() -> Iterator[Case]:
    f32 = lambda: R(64, 128)  # noqa: E731
    yield Case("add f32+f64", aten.add.Tensor, lambda: ((R(64, 128), R(64, 128, dtype=torch.float64)), {}))
    yield Case("add f32+row f64", aten.add.Tensor, lambda: ((R(64, 128), R(1, 128, dtype=torch.float64)), {}))
    yield Case("add f32 + 0-d f64", aten.add.Tensor, lambda: ((f32(), torch.tensor(2.0, dtype=torch.float64)), {}))
    yield Case("add i64 + 0-d f32", aten.add.Tensor, lambda: ((torch.ones(64, 128, dtype=torch.int64), torch.tensor(2.0)), {}))
    yield Case("add bf16+f32", aten.add.Tensor, lambda: ((R(64, 128).bfloat16(), f32()), {}))
    yield Case("add bcast", aten.add.Tensor, lambda: ((R(8, 64, 28, 28), R(1, 64, 1, 1)), {}))
    yield Case("add scalar", aten.add.Tensor, lambda: ((f32(), 1), {}))
    yield Case("add scalar alpha", aten.add.Tensor, lambda: ((f32(), f32()), {"alpha": 2}))
    yield Case("mul f32*bool", aten.mul.Tensor, lambda: ((f32(), R(64, 128) > 0), {}))
    yield Case("mul f32*0.5", aten.mul.Tensor, lambda: ((f32(), 0.5), {}))
    yield Case("mul bf16*0.5", aten.mul.Tensor, lambda: ((R(64, 128).bfloat16(), 0.5), {}))
    yield Case("mul i64*0.5", aten.mul.Tensor, lambda: ((torch.ones(64, 128, dtype=torch.int64), 0.5), {}))
    yield Case("mul f64*0.5", aten.mul.Tensor, lambda: ((R(64, 128, dtype=torch.float64), 0.5), {}))
    yield Case("mul bool*True", aten.mul.Tensor, lambda: ((R(64, 128) > 0, True), {}))
    yield Case("div i64/i64", aten.div.Tensor, lambda: ((torch.ones(64, 128, dtype=torch.int64),) * 2, {}))
    yield Case("div_.Scalar", aten.div_.Scalar, lambda: ((f32(), 0.9), {}))
    yield Case("add_ f32 += f64", aten.add_.Tensor, lambda: ((f32(), R(64, 128, dtype=torch.float64)), {}))
    yield Case("add_ bf16 += f32", aten.add_.Tensor, lambda: ((R(64, 128).bfloat16(), f32()), {}))
    yield Case("rsub.Scalar", aten.rsub.Scalar, lambda: ((f32(), 1.0), {}))
    yield Case("sub alpha", aten.sub.Tensor, lambda: ((f32(), f32()), {"alpha": 0.5}))
    yield Case("eq f32,f64", aten.eq.Tensor, lambda: ((f32(), R(64, 128, dtype=torch.float64)), {}))
    yield Case("ge.Scalar f32", aten.ge.Scalar, lambda: ((f32(), 0), {}))
    yield Case("ge.Scalar i64", aten.ge.Scalar, lambda: ((torch.ones(64, 128, dtype=torch.int64), 0), {}))
    yield Case("lt.Scalar i64<0.5", aten.lt.Scalar, lambda: ((torch.ones(64, 128, dtype=torch.int64), 0.5), {}))
    yield Case("ne.Scalar i64", aten.ne.Scalar, lambda: ((torch.ones(32, dtype=torch.int64), -100), {}))
    yield Case("where f32,f64", aten.where.self, lambda: ((R(64, 128) > 0, f32(), R(64, 128, dtype=torch.float64)), {}))
    yield Case("where f32, 0-d f32", aten.where.self, lambda: ((R(64, 128) > 0, f32(), torch.tensor(0.0)), {}))
    yield Case("where i64,f32", aten.where.self, lambda: ((R(64, 128) > 0, torch.ones(64, 128, dtype=torch.int64), f32()), {}))
    yield Case("bitwise_and bool,i64", aten.bitwise_and.Tensor, lambda: ((R(64, 128) > 0, torch.ones(64, 128, dtype=torch.int64)), {}))
    yield Case("exp i64", aten.exp.default, lambda: ((torch.ones(64, 128, dtype=torch.int64),), {}))
    yield Case("sqrt f32", aten.sqrt.default, lambda: ((R(64, 128).abs(),), {}))
    yield Case("clamp i64 by floats", aten.clamp.default, lambda: ((torch.ones(64, 128, dtype=torch.int64), -1.0, 1.0), {}))
    yield Case("clamp f32", aten.clamp.default, lambda: ((f32(), -1.0, 1.0), {}))
    yield Case("pow.Tensor_Scalar", aten.pow.Tensor_Scalar, lambda: ((f32(), 2), {}))
    yield Case("pow.Scalar", aten.pow.Scalar, lambda: ((2.0, f32()), {}))
    yield Case("masked_fill", aten.masked_fill.Scalar, lambda: ((f32(), R(64, 128) > 0, 2.0), {}))
    yield Case("lerp_", aten.lerp_.Scalar, lambda: ((f32(), f32(), 0.1), {}))
    yield Case("addcdiv_", aten.addcdiv_.default, lambda: ((f32(), f32(), f32().abs() + 1), {"value": -0.01}))
    yield Case("addcmul_", aten.addcmul_.default, lambda: ((f32(), f32(), f32()), {"value": 0.01}))
    yield Case("gelu", aten.gelu.default, lambda: ((R(8, 64, 28, 28),), {}))
    yield Case("gelu_backward", aten.gelu_backward.default, lambda: ((R(8, 64, 28, 28), R(8, 64, 28, 28)), {}))
    yield Case("_to_copy bf16", aten._to_copy.default, lambda: ((f32(),), {"dtype": torch.bfloat16}))
    yield Case("clone transposed", aten.clone.default, lambda: ((R(8, 64, 28, 28).transpose(1, 3),), {}))
    yield Case("copy_ f32<-f64", aten.copy_.default, lambda: ((f32(), R(64, 128, dtype=torch.float64)), {}))
    yield Case("expand (view)", aten.expand.default, lambda: ((R(1, 64, 1, 28), [8, 64, 28, 28]), {}))
    yield Case("clone of expanded", aten.clone.default, lambda: ((R(1, 64, 1, 28).expand(8, 64, 28, 28),), {}))
    yield Case("cat", aten.cat.default, lambda: (([R(8, 64, 28, 28), R(8, 64, 28, 28)], 1), {}))


def _reduction_cases() -> Iterator[Case]:
    x = lambda: R(8, 64, 28, 28)  # noqa: E731
    xb = lambda: R(8, 64, 28, 28).bfloat16()  # noqa: E731
    yield Case("sum [0,2,3]", aten.sum.dim_IntList, lambda: ((x(), [0, 2, 3]), {}))
    yield Case("sum all", aten.sum.dim_IntList, lambda: ((x(), []), {}))
    yield Case("sum bool", aten.sum.dim_IntList, lambda: ((R(64, 128) > 0, [1]), {}))
    yield Case("sum bool all", aten.sum.default, lambda: ((R(100000) > 0,), {}))
    yield Case("sum i32", aten.sum.dim_IntList, lambda: ((torch.ones(64, 128, dtype=torch.int32), [1]), {}))
    yield Case("sum dtype f64", aten.sum.dim_IntList, lambda: ((R(64, 128), [1]), {"dtype": torch.float64}))
    yield Case("sum bf16 [0,2,3]", aten.sum.dim_IntList, lambda: ((xb(), [0, 2, 3]), {}))
    yield Case("sum bf16 [1,3]", aten.sum.dim_IntList, lambda: ((xb(), [1, 3]), {}))
    yield Case("sum bf16 [2,3]", aten.sum.dim_IntList, lambda: ((xb(), [2, 3]), {}))
    yield Case("sum bf16 [0,1]", aten.sum.dim_IntList, lambda: ((xb(), [0, 1]), {}))
    yield Case("sum bf16 CL [0,2,3]", aten.sum.dim_IntList, lambda: ((R(8, 28, 28, 64).permute(0, 3, 1, 2).bfloat16(), [0, 2, 3]), {}))
    yield Case("mean [2,3]", aten.mean.dim, lambda: ((x(), [2, 3], True), {}))
    yield Case("mean all", aten.mean.dim, lambda: ((x(), [0, 1, 2, 3]), {}))
    yield Case("mean f64", aten.mean.dim, lambda: ((R(64, 128, dtype=torch.float64), [1]), {}))
    yield Case("mean bf16", aten.mean.dim, lambda: ((xb(), [-1]), {}))
    yield Case("mean.default bf16", aten.mean.default, lambda: ((R(64, 128).bfloat16(),), {}))
    yield Case("var_mean", aten.var_mean.correction, lambda: ((x(), [0, 2, 3]), {"correction": 0, "keepdim": True}))
    yield Case("amax", aten.amax.default, lambda: ((x(), [1]), {}))
    yield Case("amax all", aten.amax.default, lambda: ((R(100000), [0]), {}))
    yield Case("any f32", aten.any.dim, lambda: ((R(64, 128), 1), {}))
    yield Case("cumsum", aten.cumsum.default, lambda: ((x(), 1), {}))
    yield Case("cumsum bool", aten.cumsum.default, lambda: ((R(64, 128) > 0, 1), {}))
    yield Case("prod all", aten.prod.default, lambda: ((R(100000),), {}))


def _nn_cases() -> Iterator[Case]:
    c = 64
    x = lambda: R(8, c, 28, 28)  # noqa: E731
    stats = lambda: (torch.zeros(c), torch.ones(c))  # noqa: E731
    yield Case("batch_norm train", aten.native_batch_norm.default, lambda: ((x(), R(c), R(c), *stats(), True, 0.1, 1e-5), {}))
    yield Case("batch_norm eval", aten.native_batch_norm.default, lambda: ((x(), R(c), R(c), *stats(), False, 0.1, 1e-5), {}))
    yield Case("batch_norm train CL", aten.native_batch_norm.default, lambda: (
        (x().to(memory_format=CL), R(c), R(c), *stats(), True, 0.1, 1e-5), {}))
    yield Case("batch_norm train HW=1", aten.native_batch_norm.default, lambda: (
        (R(32, 256, 1, 1), R(256), R(256), torch.zeros(256), torch.ones(256), True, 0.1, 1e-5), {}))
    yield Case("batch_norm 2-D", aten.native_batch_norm.default, lambda: (
        (R(32, 256), R(256), R(256), torch.zeros(256), torch.ones(256), True, 0.1, 1e-5), {}))
    yield Case("batch_norm 3-D", aten.native_batch_norm.default, lambda: (
        (R(8, 64, 100), R(64), R(64), torch.zeros(64), torch.ones(64), True, 0.1, 1e-5), {}))
    yield Case("batch_norm bf16", aten.native_batch_norm.default, lambda: ((x().bfloat16(), R(c), R(c), *stats(), True, 0.1, 1e-5), {}))
    yield Case("_native_batch_norm_legit_functional", aten._native_batch_norm_legit_functional.default, lambda: (
        (x(), R(c), R(c), *stats(), True, 0.1, 1e-5), {}))
    yield Case("batch_norm_backward", aten.native_batch_norm_backward.default, lambda: (
        (x(), x(), R(c), *stats(), R(c), torch.rand(c), True, 1e-5, [True, True, True]), {}))
    yield Case("batch_norm_backward no dx", aten.native_batch_norm_backward.default, lambda: (
        (x(), x(), R(c), *stats(), R(c), torch.rand(c), True, 1e-5, [False, True, True]), {}))

    def ln_bwd(shape: tuple[int, ...], mask: list[bool], dtype: torch.dtype = torch.float32) -> tuple[tuple, dict]:
        n = shape[-1]
        xx, w, b = R(*shape, dtype=dtype), R(n, dtype=dtype), R(n, dtype=dtype)
        _, m, r = aten.native_layer_norm.default(xx, [n], w, b, 1e-5)
        return (R(*shape, dtype=dtype), xx, [n], m, r, w, b, mask), {}

    def gn_bwd(mask: list[bool], dtype: torch.dtype = torch.float32) -> tuple[tuple, dict]:
        xx, w = R(8, c, 28, 28, dtype=dtype), R(c, dtype=dtype)
        _, m, r = aten.native_group_norm.default(xx, w, w, 8, c, 784, 32, 1e-5)
        return (R(8, c, 28, 28, dtype=dtype), xx, m, r, w, 8, c, 784, 32, mask), {}

    yield Case("group_norm", aten.native_group_norm.default, lambda: ((x(), R(c), R(c), 8, c, 784, 32, 1e-5), {}))
    yield Case("group_norm CL", aten.native_group_norm.default, lambda: (
        (x().to(memory_format=CL), R(c), R(c), 8, c, 784, 32, 1e-5), {}))
    yield Case("group_norm_backward", aten.native_group_norm_backward.default, lambda: gn_bwd([True] * 3))
    yield Case("group_norm_backward bf16", aten.native_group_norm_backward.default, lambda: gn_bwd([True] * 3, torch.bfloat16))
    yield Case("layer_norm", aten.native_layer_norm.default, lambda: ((R(32, 128, 256), [256], R(256), R(256), 1e-5), {}))
    yield Case("layer_norm non-contiguous", aten.native_layer_norm.default, lambda: (
        (R(128, 32, 256).transpose(0, 1), [256], R(256), R(256), 1e-5), {}))
    yield Case("layer_norm_backward", aten.native_layer_norm_backward.default, lambda: ln_bwd((32, 128, 256), [True] * 3))
    yield Case("layer_norm_backward dx only", aten.native_layer_norm_backward.default, lambda: ln_bwd((32, 128, 256), [True, False, False]))
    yield Case("layer_norm_backward bf16", aten.native_layer_norm_backward.default, lambda: ln_bwd((32, 128, 256), [True] * 3, torch.bfloat16))
    s = lambda: R(16, 8, 128, 128)  # noqa: E731
    yield Case("_softmax", aten._softmax.default, lambda: ((s(), -1, False), {}))
    yield Case("_softmax non-contiguous", aten._softmax.default, lambda: ((s().transpose(1, 2), -1, False), {}))
    yield Case("_log_softmax", aten._log_softmax.default, lambda: ((s(), -1, False), {}))
    yield Case("_softmax_backward_data", aten._softmax_backward_data.default, lambda: ((s(), s(), -1, torch.float32), {}))
    yield Case("_log_softmax_backward_data", aten._log_softmax_backward_data.default, lambda: ((s(), s(), -1, torch.float32), {}))
    yield Case("native_dropout", aten.native_dropout.default, lambda: ((x(), 0.1, True), {}))
    yield Case("native_dropout bf16", aten.native_dropout.default, lambda: ((x().bfloat16(), 0.1, True), {}))
    yield Case("native_dropout eval", aten.native_dropout.default, lambda: ((x(), 0.1, False), {}))
    yield Case("bernoulli_", aten.bernoulli_.float, lambda: ((x(), 0.9), {}))
    pooled = lambda: aten.max_pool2d_with_indices.default(x(), [3, 3], [2, 2], [1, 1])  # noqa: E731
    yield Case("max_pool2d_with_indices", aten.max_pool2d_with_indices.default, lambda: ((x(), [3, 3], [2, 2], [1, 1]), {}))
    yield Case("max_pool2d_with_indices_backward", aten.max_pool2d_with_indices_backward.default, lambda: (
        (R(8, c, 14, 14), x(), [3, 3], [2, 2], [1, 1], [1, 1], False, pooled()[1]), {}))
    yield Case("avg_pool2d", aten.avg_pool2d.default, lambda: ((x(), [2, 2], [2, 2]), {}))
    yield Case("avg_pool2d_backward", aten.avg_pool2d_backward.default, lambda: (
        (R(8, c, 14, 14), x(), [2, 2], [2, 2], [0, 0], False, True, None), {}))
    for hi, ho in ((28, 56), (28, 65), (8, 16)):
        yield Case(f"upsample_nearest2d {hi}->{ho}", aten.upsample_nearest2d.default, lambda hi=hi, ho=ho: ((R(4, 16, hi, hi), [ho, ho]), {}))
        yield Case(f"upsample_bilinear2d {hi}->{ho}", aten.upsample_bilinear2d.default, lambda hi=hi, ho=ho: ((R(4, 16, hi, hi), [ho, ho], False), {}))
        yield Case(f"upsample_bilinear2d CL {hi}->{ho}", aten.upsample_bilinear2d.default, lambda hi=hi, ho=ho: (
            (R(4, 16, hi, hi).to(memory_format=CL), [ho, ho], True), {}))
        yield Case(f"upsample_bilinear2d_backward {hi}->{ho}", aten.upsample_bilinear2d_backward.default, lambda hi=hi, ho=ho: (
            (R(4, 16, ho, ho), [ho, ho], [4, 16, hi, hi], False), {}))
        yield Case(f"upsample_nearest2d_backward {hi}->{ho}", aten.upsample_nearest2d_backward.default, lambda hi=hi, ho=ho: (
            (R(4, 16, ho, ho), [ho, ho], [4, 16, hi, hi]), {}))
    yield Case("upsample_bilinear2d bf16 generic", aten.upsample_bilinear2d.default, lambda: ((R(4, 16, 28, 28).bfloat16(), [65, 65], False), {}))
    yield Case("upsample_nearest1d", aten.upsample_nearest1d.default, lambda: ((R(4, 16, 28), [56]), {}))
    yield Case("upsample_trilinear3d", aten.upsample_trilinear3d.default, lambda: ((R(2, 16, 8, 8, 8), [16, 16, 16], False), {}))
    yield Case("upsample_bicubic2d", aten.upsample_bicubic2d.default, lambda: ((R(4, 16, 28, 28), [56, 56], False), {}))


def _misc_cases() -> Iterator[Case]:
    a, b = lambda: R(512, 256), lambda: R(256, 384)  # noqa: E731
    yield Case("mm", aten.mm.default, lambda: ((a(), b()), {}))
    yield Case("mm A^T", aten.mm.default, lambda: ((R(256, 512).t(), b()), {}))
    yield Case("mm strided A", aten.mm.default, lambda: ((R(512, 512)[:, ::2], b()), {}))
    yield Case("addmm", aten.addmm.default, lambda: ((R(384), a(), b()), {}))
    yield Case("bmm", aten.bmm.default, lambda: ((R(16, 128, 64), R(16, 64, 128)), {}))
    yield Case("bmm batch-permuted", aten.bmm.default, lambda: ((R(128, 16, 64).transpose(0, 1), R(16, 64, 128)), {}))
    bf = torch.bfloat16
    yield Case("mm bf16", aten.mm.default, lambda: ((a().to(bf), b().to(bf)), {}), approx=True)
    yield Case("mm bf16 big", aten.mm.default, lambda: ((R(1024, 1024, dtype=bf), R(1024, 1024, dtype=bf)), {}), approx=True)
    yield Case("addmm bf16", aten.addmm.default, lambda: ((R(384, dtype=bf), a().to(bf), b().to(bf)), {}), approx=True)
    yield Case("bmm bf16", aten.bmm.default, lambda: ((R(64, 256, 64, dtype=bf), R(64, 64, 256, dtype=bf)), {}), approx=True)
    t = lambda: R(4096, 512)  # noqa: E731
    yield Case("sort", aten.sort.default, lambda: ((t(), -1), {}))
    yield Case("sort dim0", aten.sort.default, lambda: ((t(), 0), {}))
    yield Case("sort.stable", aten.sort.stable, lambda: ((t(),), {"stable": True, "dim": -1}))
    yield Case("topk", aten.topk.default, lambda: ((t(), 10, -1), {}))
    w = lambda: R(1000, 256)  # noqa: E731
    ids = lambda: torch.randint(0, 1000, (32, 128))  # noqa: E731
    yield Case("embedding", aten.embedding.default, lambda: ((w(), ids()), {}))
    yield Case("embedding expanded ids", aten.embedding.default, lambda: ((w(), torch.randint(0, 1000, (1, 64)).expand(4, 64)), {}))
    yield Case("embedding_dense_backward non-contiguous grad", aten.embedding_dense_backward.default, lambda: (
        (R(64, 4, 128).transpose(0, 1), torch.randint(0, 1000, (4, 64)), 1000, -1, False), {}))
    yield Case("index_select strided index", aten.index_select.default, lambda: ((w(), 0, torch.randint(0, 1000, (64, 4)).t()[0]), {}))
    yield Case("embedding_dense_backward", aten.embedding_dense_backward.default, lambda: ((R(32, 128, 256), ids(), 1000, -1, False), {}))
    yield Case("index_put acc", aten.index_put.default, lambda: ((torch.zeros(1000, 256), [ids().flatten()], R(4096, 256), True), {}))
    yield Case("index_put acc int32", aten.index_put.default, lambda: ((torch.zeros(1000, 256), [ids().flatten().int()], R(4096, 256), True), {}))
    yield Case("index.Tensor", aten.index.Tensor, lambda: ((w(), [ids()]), {}))
    yield Case("index.Tensor int32", aten.index.Tensor, lambda: ((w(), [ids().int()]), {}))
    yield Case("index_select", aten.index_select.default, lambda: ((w(), 0, ids().flatten()), {}))
    yield Case("gather", aten.gather.default, lambda: ((w(), 1, torch.randint(0, 256, (1000, 10))), {}))
    yield Case("scatter.src", aten.scatter.src, lambda: ((w(), 1, torch.randint(0, 256, (1000, 10)), R(1000, 10)), {}))
    yield Case("scatter_add", aten.scatter_add.default, lambda: ((w(), 1, torch.randint(0, 256, (1000, 10)), R(1000, 10)), {}))
    yield Case("repeat", aten.repeat.default, lambda: ((w(), [2, 1]), {}))
    yield Case("tril", aten.tril.default, lambda: ((R(16, 256, 256),), {}))
    yield Case("triu", aten.triu.default, lambda: ((R(16, 256, 256), 1), {}))


def all_cases() -> Iterator[Case]:
    yield from _conv_cases()
    yield from _pointwise_cases()
    yield from _reduction_cases()
    yield from _nn_cases()
    yield from _misc_cases()


# --------------------------------------------------------------------------------------------
# real graphs
# --------------------------------------------------------------------------------------------


def _small_cnn_step() -> tuple[Callable[..., Any], tuple]:
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(16, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 64, 1),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )
    batch = (torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,)))
    return _training_step(model, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])), (model, batch)


def _tiny_bert_step() -> tuple[Callable[..., Any], tuple]:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=128, attn_implementation="eager")
    model = BertForMaskedLM(cfg).train()
    batch = (torch.randint(0, 1000, (4, 64)), torch.randint(0, 1000, (4, 64)))
    return _training_step(model, lambda m, b: m(input_ids=b[0], labels=b[1]).loss), (model, batch)


def _training_step(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    def step(params: dict, buffers: dict, batch: tuple) -> tuple:
        out = loss_fn(_Bound(model, params, buffers), batch)
        return out, torch.autograd.grad(out, list(params.values()))
    return step


class _Bound:
    """Calls ``model`` through torch.func.functional_call with the given params/buffers."""

    def __init__(self, model: torch.nn.Module, params: dict, buffers: dict) -> None:
        self.model, self.params, self.buffers = model, params, buffers

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(self.model, (self.params, self.buffers), args, kwargs)


def graph_results(name: str) -> list[Result]:
    """Trace a training step with make_fx (Core ATen) and measure every op node on real inputs."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    step, (model, batch) = {"cnn": _small_cnn_step, "bert": _tiny_bert_step}[name]()
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    gm = make_fx(step, tracing_mode="fake", decomposition_table=core_aten_decompositions())(params, buffers, batch)
    results: list[Result] = []

    class Probe(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
                return super().run_node(n)
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            measured, model_bytes = measure(n.target, args, kwargs)
            if measured or model_bytes:
                results.append(Result(f"{name}:{n.name}", str(n.target), describe(args, kwargs),
                                      measured, model_bytes, approx=_approx_node(n.target, args)))
            return n.target(*args, **kwargs)

    leaves = tree_flatten((params, buffers, batch))[0]
    with torch.no_grad():
        Probe(gm).run(*[x.detach() for x in leaves])
    return results


def _approx_node(op: torch._ops.OpOverload, args: tuple) -> bool:
    if op is aten.convolution_backward.default:
        stride = args[4]
        return any(s > 1 for s in stride) or args[9] > 1
    return op in (aten.mm.default, aten.bmm.default, aten.addmm.default) and args[-1].dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------


def run(cases: list[Case]) -> list[Result]:
    results = []
    for case in cases:
        args, kwargs = case.make()
        measured, model = measure(case.op, args, kwargs)
        results.append(Result(case.label, str(case.op), describe(args, kwargs), measured, model, case.approx))
    return results


def print_table(results: list[Result], show_all: bool) -> None:
    print(f"{'case':34s} {'op':38s} {'shapes':40s} {'measured':>11s} {'model':>11s} {'error':>9s}")
    for r in results:
        if not show_all and r.measured == 0 and r.model == 0:
            continue
        err = r.model - r.measured
        rel = f"{100 * err / r.measured:+.1f}%" if r.measured else ("0" if err == 0 else f"{err:+d}B")
        flag = " " if r.ok else ("~" if r.approx else "!")
        print(f"{r.label[:34]:34s} {r.op[:38]:38s} {r.shapes[:40]:40s} {r.measured:11d} {r.model:11d} {rel:>9s} {flag}")
    exact = [r for r in results if not r.approx]
    bad = [r for r in exact if not r.ok]
    approx_bad = [r for r in results if r.approx and not r.ok]
    print(f"\n{len(results)} calls, threads={torch.get_num_threads()}: {len(exact) - len(bad)}/{len(exact)} exact-rule "
          f"calls within 2% or {TOLERANCE_BYTES} B; {len(approx_bad)} approximate-rule calls outside that (~).")
    for r in bad:
        print(f"  MISMATCH {r.label}: measured {r.measured}, model {r.model}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before measuring")
    parser.add_argument("--only", default="", help="only cases whose label contains this")
    parser.add_argument("--no-graphs", action="store_true", help="skip the traced CNN / BERT graphs")
    parser.add_argument("--all", action="store_true", help="also print calls with 0 measured and 0 modelled")
    ns = parser.parse_args(argv)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    results = run([c for c in all_cases() if ns.only in c.label])
    if not ns.no_graphs and not ns.only:
        for name in ("cnn", "bert"):
            results += graph_results(name)
    print_table(results, ns.all)
    return 1 if any(not r.ok and not r.approx for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
