"""CPU workspace model: transient allocator bytes an ATen op takes beyond its outputs.

Measured on CPU (torch 2.13, oneDNN 3.12, AVX-512 with bf16, 2 cores) with the c10 CPU
allocator's alloc/free events from ``torch.profiler`` (``profile_memory=True``): for one call,
``transient = max(running sum of the events) - bytes of the (meta) outputs``.  The script
``bench/calibrate_workspace.py`` re-measures every rule and prints model vs measurement.

What allocates beyond its outputs on CPU (everything not listed measured 0, or a few bytes):

* **TensorIterator type promotion**: every operand whose dtype differs from the computation dtype is
  first copied (``numel * itemsize(common)``); a Python number passed as a tensor operand is wrapped
  into a 0-dim tensor (8 bytes; bool 1, complex 16) and cast like the others; an in-place op whose
  ``self`` dtype differs from the common dtype computes into a temporary and copies back.
* **Reductions**: input cast to the output dtype (``sum`` of bool/int, ``dtype=``, ``any`` of
  non-bool); bf16/f16 ``sum`` whose two innermost iteration dims are both reduced computes in an
  fp32 copy; bf16/f16 ``mean`` always does; full reductions (one output element, >= 32768 inputs)
  keep one partial per thread.
* **oneDNN convolution** (``convolution``/``convolution_backward``): reorders of input / weight /
  grad to blocked or NHWC layouts, a blocked result converted to the dense output, and scratchpads.
  The activation- and weight-sized buffers are exact; the scratchpads are exact where oneDNN's
  booking was identified (1x1 stride reduce, im2col, weight-gradient reduction buffer chosen by
  oneDNN's thread balancer, ``cpu_reducer_t`` bias/weight reducers, the 16-padded bias copy when
  ``oc % 16``) and otherwise an approximation (see ``_brg_strided_scratch``).  1x1 kernels are
  never oneDNN's "first conv" (ic < 16): unpadded ones run the 1x1 kernel on blocked src (input
  channels padded to 16), padded ones the gemm kernel.
  Slow (THNN) paths allocate an im2col ``columns`` buffer.
* bf16 ``mm``/``bmm``/``addmm`` go through oneDNN matmul (per-thread scratch, approximate); fp32
  matmuls copy an operand only when neither of its last two strides is 1.
* Small fixed buffers: batch / group norm statistics, layer-norm backward per-thread partials,
  ``sort`` index scratch, ``native_dropout`` noise, upsample index/weight tables, contiguous copies
  of non-contiguous softmax / layer-norm inputs, int32 -> int64 index conversion.

* Contiguous copies of non-contiguous indices/grad in ``embedding``(``_dense_backward``) and
  ``index_select`` (e.g. an expanded ``token_type_ids`` buffer).

Not modelled (returns 0, measured 0): ops without a rule, including views, ``clone``/``_to_copy``/
``copy_`` (the copy kernel casts on the fly), pooling and its backward, gather/scatter/
``scatter_add``, ``cat``, ``topk``, ``cumsum`` of floats, ``var``/``var_mean``/``std``,
``gelu``/``threshold_backward``, ``tril``/``triu``, ``bernoulli_``, upsample backward.  oneDNN
choices on ISAs other than AVX-512 are extrapolated (channel blocks of 16).  Thread-dependent
buffers use ``torch.get_num_threads()`` at call time, which must match the run being predicted.
First calls allocate the same as later ones (oneDNN's primitive cache / JIT code is not c10 memory).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._prims_common

__all__ = ["WORKSPACE_OPS", "cpu_workspace_bytes"]

aten = torch.ops.aten

GRAIN_SIZE = 32768
"""at::internal::GRAIN_SIZE: below this many elements CPU kernels run serially."""

ONEDNN_ENTRY_PAD = 128
"""oneDNN scratchpad booking adds ``max(alignment, 128)`` bytes to every entry."""

WGRAD_REDUCTION_OVERHEAD = 8320
"""Fixed bytes booked next to oneDNN's weight-gradient reduction buffer (barrier + bias reducer)."""

CL_BRGEMM_SCRATCH_BASE = 4096
CL_BRGEMM_SCRATCH_PER_THREAD = 4096 + 24
"""Channels-last (brgemm) convolution scratchpad: ``4096 + nthr * 4120`` bytes (measured)."""

BRG_STRIDED_BASE = types.MappingProxyType({4: 12288, 2: 16384})
BRG_STRIDED_PER_THREAD = 20480 + 24
"""Strided backward-data (brgconv_strided) scratchpad: ``base + nthreads * (one image of grad_output
+ 20504)`` bytes; the fixed part is fitted (measured 8-70 KiB, larger for 7x7 kernels)."""

BF16_WGRAD_PER_THREAD = 12288
BF16_WGRAD_1X1_OVERHEAD = 8192
"""bf16 weight gradient: per minibatch thread an fp32 weight accumulator and transposed copies of
one image of input and grad_output, plus this many bytes (fitted)."""

Rule = Callable[["_Call"], int]


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One op call: schema-bound arguments, outputs and the thread count."""

    op: torch._ops.OpOverload
    args: Mapping[str, Any]
    outputs: tuple[torch.Tensor, ...]
    nthreads: int

    @property
    def family(self) -> str:
        return self.op._schema.name.split("::")[-1]

    @property
    def overload(self) -> str:
        return self.op._overloadname

    def tensor(self, name: str) -> torch.Tensor | None:
        value = self.args.get(name)
        return value if isinstance(value, torch.Tensor) else None

    def out(self, index: int = 0) -> torch.Tensor | None:
        return self.outputs[index] if index < len(self.outputs) else None


def _bind(op: torch._ops.OpOverload, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map positional and keyword arguments onto the schema's argument names (defaults filled)."""
    from peakcut.ir.registry import bind_arguments

    return bind_arguments(op._schema.arguments, args, kwargs)


def _isz(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _prod(xs: Iterable[int]) -> int:
    return math.prod(int(x) for x in xs)


def _rnd(x: int, m: int) -> int:
    return -(-x // m) * m


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _peak(events: Iterable[int]) -> int:
    """Highest running sum of a sequence of signed allocation sizes."""
    run = peak = 0
    for b in events:
        run += b
        peak = max(peak, run)
    return peak


def _is_reduced_float(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


def _avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


# --------------------------------------------------------------------------------------------
# TensorIterator pointwise ops: type promotion casts and wrapped Python scalars
# --------------------------------------------------------------------------------------------

def _scalar_dtype(value: bool | int | float | complex) -> torch.dtype:
    """dtype of the 0-dim tensor a Python number is wrapped into."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, float):
        return torch.float64
    return torch.complex128


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """c10 combine_categories: a lower-priority operand only matters if of a higher category."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return torch.complex64 if higher == torch.float32 else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _result_type(operands: Sequence[torch.Tensor | bool | int | float | complex]) -> torch.dtype:
    """torch.result_type over several operands (dim tensors > 0-dim tensors > Python numbers)."""
    tiers: list[torch.dtype | None] = [None, None, None]
    for v in operands:
        if isinstance(v, torch.Tensor):
            tier, dt = (0 if v.dim() > 0 else 1), v.dtype
        else:
            tier, dt = 2, _scalar_dtype(v)
            if dt.is_floating_point:
                dt = torch.get_default_dtype()
            elif dt.is_complex:
                dt = torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
        tiers[tier] = dt if tiers[tier] is None else torch.promote_types(tiers[tier], dt)
    result = _combine(tiers[0], _combine(tiers[1], tiers[2]))
    return result if result is not None else torch.get_default_dtype()


_COMPARISON = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
})

# Families whose `.Scalar`-style overloads wrap the named Scalar argument into a tensor operand.
_WRAPPED_SCALAR_ARGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "add": ("other",), "sub": ("other",), "rsub": ("other",), "mul": ("other",),
    "div": ("other",), "true_divide": ("other",), "floor_divide": ("other",),
    "remainder": ("other", "self"), "fmod": ("other",), "pow": ("self",),
    "eq": ("other",), "ne": ("other",), "lt": ("other",), "le": ("other",), "gt": ("other",),
    "ge": ("other",), "bitwise_and": ("other",), "bitwise_or": ("other",),
    "bitwise_xor": ("other",), "where": ("self", "other"), "xlogy": ("self", "other"),
})

# Operand arguments that take part in dtype promotion (default: every Tensor argument).
_PROMOTED_ARGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "where": ("self", "other"),
    "masked_fill": (),
})

_POINTWISE = frozenset({
    # binary arithmetic / comparison / logical / bitwise
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
    "pow", "atan2", "hypot", "copysign", "maximum", "minimum", "fmax", "fmin", "xlogy",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "where", "lerp", "addcmul", "addcdiv",
    "clamp", "clamp_min", "clamp_max", "masked_fill",
    # unary ops that promote integer inputs to float
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "sigmoid", "tanh", "erf", "erfc", "erfinv", "lgamma", "digamma",
})


def _pointwise(c: _Call) -> int:
    """TensorIterator ops.

    Measured: each operand whose dtype differs from the common dtype is cast first
    (``numel * itemsize(common)``; e.g. ``add(f32, f64)`` copies the f32 operand to f64, ``mul(f32,
    bool)`` copies the mask to f32, ``exp(int64)`` copies to f32); a Python number given for a tensor
    operand (``add.Tensor(x, 1)``, ``ge.Scalar(x, 0)``) is wrapped into a 0-dim tensor of 8 bytes
    (bool 1, complex 16) and cast too (``mul(f32, 0.5)``: 8 + 4 bytes); an in-place op whose
    ``self`` dtype differs from the common dtype adds a temporary output of the common dtype.
    Scalar arguments that are not operands (alpha, clamp bounds, pow exponent, fill values) cost 0.
    """
    family = c.family
    inplace = family.endswith("_")
    base = family.rstrip("_")
    names = _PROMOTED_ARGS.get(base)
    wrap_names = _WRAPPED_SCALAR_ARGS.get(base, ()) if "Scalar" in c.overload else ()
    operands: list[torch.Tensor | bool | int | float | complex] = []
    wrapped = 0
    for arg in c.op._schema.arguments:
        value = c.args.get(arg.name)
        if value is None or (names is not None and arg.name not in names):
            continue
        is_tensor_arg = str(arg.type).startswith("Tensor") or str(arg.type).startswith("Optional[Tensor")
        if isinstance(value, torch.Tensor) and is_tensor_arg:
            operands.append(value)
        elif isinstance(value, (bool, int, float, complex)) and (is_tensor_arg or arg.name in wrap_names):
            operands.append(value)
            wrapped += _isz(_scalar_dtype(value))
    if not operands:
        return 0
    out = c.out()
    promote = base in _COMPARISON or inplace or out is None
    common = _result_type(operands) if promote else out.dtype
    casts = 0
    for v in operands:
        dt = v.dtype if isinstance(v, torch.Tensor) else _scalar_dtype(v)
        if dt != common:
            numel = v.numel() if isinstance(v, torch.Tensor) else 1
            casts += numel * _isz(common)
    self_t = c.tensor("self")
    if inplace and self_t is not None and self_t.dtype != common:
        casts += self_t.numel() * _isz(common)
    return wrapped + casts


# --------------------------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------------------------


def _reduced_dims(t: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(t.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(t.dim(), 1) for d in dims})


def _uses_fp32_acc_buffer(t: torch.Tensor, dims: Sequence[int]) -> bool:
    """ATen ``should_use_acc_buffer``: after TensorIterator moves reduced dims innermost (by stride)
    and coalesces, the first two iteration dims are both reduced."""
    reduced = set(dims)
    order = sorted((d for d in range(t.dim()) if t.shape[d] != 1 and d in reduced), key=t.stride)
    order += sorted((d for d in range(t.dim()) if t.shape[d] != 1 and d not in reduced), key=t.stride)
    groups: list[tuple[bool, int]] = []  # (is_reduced, extent in elements of the run's end)
    for d in order:
        is_red = d in reduced
        if groups and groups[-1][0] == is_red and groups[-1][1] == t.stride(d):
            groups[-1] = (is_red, t.stride(d) * t.shape[d])
        else:
            groups.append((is_red, t.stride(d) * t.shape[d]))
    return len(groups) >= 2 and groups[0][0] and groups[1][0]


def _two_pass_buffer(c: _Call, numel_in: int, out: torch.Tensor | None, acc: torch.dtype) -> int:
    """Full reductions (one output element) of >= GRAIN_SIZE inputs keep one partial per thread."""
    if out is None or out.numel() != 1 or numel_in < GRAIN_SIZE or c.nthreads <= 1:
        return 0
    return c.nthreads * _isz(acc)


def _reduction(c: _Call) -> int:
    """sum / prod / amax / amin / any / all / cumsum / cumprod.

    Measured: the input is cast to the output dtype when they differ (``sum`` of bool or int32 ->
    int64, ``sum(x, dtype=f64)``, ``any`` of float -> bool): ``numel * itemsize(out)``.  A bf16/f16
    ``sum`` whose two innermost reduced dims cannot coalesce (e.g. dims [0, 2, 3] of NCHW) computes
    ``sum(x.float())`` into an fp32 temporary: ``numel * 4 + out_numel * 4``.  A full reduction
    with one output element and >= 32768 inputs allocates ``nthreads * itemsize(out)`` partials
    when more than one thread is used.
    """
    x = c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    base = c.family.rstrip("_")
    cast = x.numel() * _isz(out.dtype) if x.dtype != out.dtype else 0
    acc = 0
    low_precision_sum = base in ("sum", "nansum") and _is_reduced_float(x.dtype) and out.dtype == x.dtype
    if low_precision_sum and _uses_fp32_acc_buffer(x, _reduced_dims(x, c.args.get("dim"))):
        acc = x.numel() * 4 + out.numel() * 4
    partials = 0 if base in ("cumsum", "cumprod") else _two_pass_buffer(c, x.numel(), out, out.dtype)
    return cast + acc + partials


def _mean(c: _Call) -> int:
    """mean.dim / mean.default.

    Measured: CPU mean is ``sum`` then ``div_`` by the element count.  bf16/f16: the sum runs in
    fp32 on an fp32 copy of the input into an fp32 result (``numel * 4 + out_numel * 4``).  Other
    dtypes: the divisor is a wrapped int64 scalar cast to the output dtype (8 + itemsize bytes, 8
    for int64); full reductions also keep per-thread partials (not at the same time as the divisor).
    """
    x = c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    if _is_reduced_float(out.dtype):
        return x.numel() * 4 + out.numel() * 4 + _two_pass_buffer(c, x.numel(), out, torch.float32)
    cast = x.numel() * _isz(out.dtype) if x.dtype != out.dtype else 0
    divisor = 8 + (0 if out.dtype == torch.int64 else _isz(out.dtype))
    return max(cast + _two_pass_buffer(c, x.numel(), out, out.dtype), divisor)


# --------------------------------------------------------------------------------------------
# normalization, softmax, dropout, sort, indexing, upsampling, repeat
# --------------------------------------------------------------------------------------------


def _acc_isz(dtype: torch.dtype) -> int:
    return 8 if dtype == torch.float64 else 4


def _batch_norm(c: _Call) -> int:
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
    fmt = _suggest_memory_format(x) if x.dim() in (4, 5) else torch.contiguous_format
    cl_kernel = fmt != torch.contiguous_format or image == 1
    return base + (c.nthreads * channels * acc if cl_kernel else 0)


def _batch_norm_backward(c: _Call) -> int:
    """native_batch_norm_backward: an input-sized buffer when grad_input is requested (measured)."""
    mask = c.args.get("output_mask") or [True, True, True]
    x = c.tensor("input")
    return _nbytes(x) if mask[0] else 0


def _group_norm(c: _Call) -> int:
    """native_group_norm: the channels-last kernel keeps per (image, channel) float sums
    ``2 * N * C * 4``; contiguous inputs need nothing (measured, f32 and bf16)."""
    x = c.tensor("input")
    if x is None or x.dim() not in (4, 5) or _suggest_memory_format(x) == torch.contiguous_format:
        return 0
    return 2 * x.shape[0] * x.shape[1] * _acc_isz(x.dtype)


def _group_norm_backward(c: _Call) -> int:
    """native_group_norm_backward: per (image, channel) float sums ``ds``/``db``: ``2 * N * C * 4``."""
    x = c.tensor("input")
    return 0 if x is None or x.dim() < 2 else 2 * x.shape[0] * x.shape[1] * _acc_isz(x.dtype)


def _contiguous_copy(t: torch.Tensor | None) -> int:
    return 0 if t is None or t.is_contiguous() else _nbytes(t)


def _layer_norm(c: _Call) -> int:
    """native_layer_norm: contiguous copies of a non-contiguous input / weight / bias (measured)."""
    return sum(_contiguous_copy(c.tensor(n)) for n in ("input", "weight", "bias"))


def _layer_norm_backward(c: _Call) -> int:
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
    partials = 2 * c.nthreads * _prod(shape) * x.element_size() if (mask[1] or mask[2]) else 0
    copies = sum(_contiguous_copy(c.tensor(n)) for n in ("grad_out", "input", "weight"))
    return partials + copies


def _softmax(c: _Call) -> int:
    """_softmax / _log_softmax and their backward: contiguous copies of non-contiguous tensor inputs."""
    return sum(_contiguous_copy(c.tensor(n)) for n in ("self", "grad_output", "output"))


def _native_dropout(c: _Call) -> int:
    """native_dropout(train=True): an input-sized noise tensor (``numel * itemsize``) (measured)."""
    x = c.tensor("input")
    train = c.args.get("train")
    return _nbytes(x) if x is not None and (train is None or train) else 0


def _sort(c: _Call) -> int:
    """sort / argsort: an int64 scratch of the sorted dim's length (``size(dim) * 8``); argsort
    also builds (and drops) the sorted values (measured, independent of threads)."""
    x = c.tensor("self")
    if x is None:
        return 0
    dim = c.args.get("dim", -1)
    length = x.shape[dim] if x.dim() > 0 else 1
    values = _nbytes(x) if c.family == "argsort" else 0
    return length * 8 + values


def _index_int32(c: _Call) -> int:
    """index / index_put / _unsafe_index{,_put}: int32 indices are converted to int64 (``numel*8``)."""
    indices = c.args.get("indices") or []
    return sum(i.numel() * 8 for i in indices if isinstance(i, torch.Tensor) and i.dtype == torch.int32)


def _embedding(c: _Call) -> int:
    """embedding / embedding_dense_backward / index_select: non-contiguous ``indices`` (``index``),
    and for the backward ``grad_output``, are copied contiguous first (measured: an expanded
    ``token_type_ids`` buffer costs ``numel * 8``)."""
    return sum(_contiguous_copy(c.tensor(n)) for n in ("indices", "index", "grad_output"))


_UPSAMPLE_TAPS = types.MappingProxyType({
    "upsample_nearest1d": 1, "upsample_nearest2d": 1, "upsample_nearest3d": 1,
    "_upsample_nearest_exact1d": 1, "_upsample_nearest_exact2d": 1, "_upsample_nearest_exact3d": 1,
    "upsample_linear1d": 2, "upsample_bilinear2d": 2, "upsample_trilinear3d": 2,
    "upsample_bicubic2d": 4,
})


def _upsample(c: _Call) -> int:
    """upsample_* forward.

    Measured: 2-D nearest/bilinear use the vectorized channels-last kernel when the input is
    channels-last with C > 3 or when ``H_out + W_out <= 128``; then a non-channels-last input is
    copied to channels-last and the result computed into a channels-last temporary
    (``in_bytes + out_bytes``).  Otherwise the generic kernel builds per output coordinate and tap an
    int64 index and a weight (``taps * O_d * (8 + itemsize)`` per spatial dim); bicubic and 1-D/3-D
    always take the generic kernel (3-D channels-last with C > 3 excepted: 0).
    """
    x = c.tensor("input") if c.tensor("input") is not None else c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    family = c.family
    spatial = x.dim() - 2
    taps = _UPSAMPLE_TAPS.get(family, 1)
    channels = x.shape[1]
    if spatial == 2 and taps <= 2:
        cl = x.is_contiguous(memory_format=torch.channels_last)
        if (cl and channels > 3) or out.shape[-1] + out.shape[-2] <= 128:
            return 0 if cl else _nbytes(x) + _nbytes(out)
    if spatial == 3 and taps <= 2 and channels > 3 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return 0
    return sum(taps * o * (8 + x.element_size()) for o in out.shape[2:])


def _repeat(c: _Call) -> int:
    """repeat: small size/stride vectors, ``32 * ndim`` bytes at the peak (measured)."""
    repeats = c.args.get("repeats") or []
    return 32 * len(repeats)


# --------------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------------


def _blas_ok(t: torch.Tensor) -> bool:
    """A matrix BLAS can read in place: one of its last two strides is 1 (leading dim large enough)."""
    rows, cols = t.shape[-2], t.shape[-1]
    s_r, s_c = t.stride(-2), t.stride(-1)
    return (s_c == 1 and (rows == 1 or s_r >= max(1, cols))) or (
        s_r == 1 and (cols == 1 or s_c >= max(1, rows))
    )


def _batch_dense(t: torch.Tensor) -> bool:
    return t.dim() < 3 or t.shape[0] == 1 or t.stride(0) == t.shape[-1] * t.shape[-2]


_MATMUL_OPERANDS = types.MappingProxyType({
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"), "baddbmm": ("batch1", "batch2"),
})


def _matmul(c: _Call) -> int:
    """mm / addmm / bmm / baddbmm.

    Measured fp32/fp64 (MKL): 0, except an operand neither of whose last two strides is 1 is
    cloned contiguous.  bf16/fp16 go through oneDNN matmul: an operand is cloned unless it is
    BLAS-readable with a dense batch stride, plus a scratchpad of ``384 + nthreads * per_thread``
    with ``per_thread ~= 4 * min(M, 64) * min(N, 512) + 640`` (+ ``2 * K * min(M, 256)`` when A is
    transposed, + ``2 * K * 64`` when M < 16, + ``2 * K * 32`` when N < 16) -- exact for large
    row-major operands, approximate otherwise.
    """
    a_name, b_name = _MATMUL_OPERANDS[c.family]
    a, b = c.tensor(a_name), c.tensor(b_name)
    if a is None or b is None:
        return 0
    if not _is_reduced_float(a.dtype):
        return sum(_nbytes(t) for t in (a, b) if not _blas_ok(t))
    copies = sum(_nbytes(t) for t in (a, b) if not (_blas_ok(t) and _batch_dense(t)))
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if m * n * k < 4096 or min(m, n, k) == 0:
        return copies
    per_thread = 4 * min(m, 64) * min(n, 512) + 640
    if a.stride(-1) != 1:
        per_thread += 2 * k * min(m, 256)
    if m < 16:
        per_thread += 2 * k * 64
    if n < 16:
        per_thread += 2 * k * 32
    return copies + 384 + c.nthreads * per_thread


# --------------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Conv:
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
        return _prod(self.ks)

    @property
    def in_sp(self) -> int:
        return _prod(self.ins)

    @property
    def out_sp(self) -> int:
        return _prod(self.outs)

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


def _ints(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    vals = tuple(int(x) for x in v)
    return vals * n if len(vals) == 1 and n > 1 else vals


def _conv_geometry(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_spatial: Sequence[int]) -> _Conv:
    """Forward-conv geometry of ``convolution(x, w)`` (not transposed)."""
    nsp = x.dim() - 2
    return _Conv(
        n=x.shape[0], ic=x.shape[1], oc=w.shape[0], ins=tuple(x.shape[2:]), outs=tuple(out_spatial),
        ks=tuple(w.shape[2:]), stride=_ints(a["stride"], nsp), padding=_ints(a["padding"], nsp),
        dilation=_ints(a["dilation"], nsp), groups=int(a["groups"]), isz=x.element_size(),
    )


def _conv_out_spatial(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any]) -> tuple[int, ...]:
    nsp = x.dim() - 2
    st, pd, dl = _ints(a["stride"], nsp), _ints(a["padding"], nsp), _ints(a["dilation"], nsp)
    if a.get("transposed"):
        op = _ints(a.get("output_padding") or [0], nsp)
        return tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1
                     for i, s, p, d, k, o in zip(x.shape[2:], st, pd, dl, w.shape[2:], op, strict=True))
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, s, p, d, k in zip(x.shape[2:], st, pd, dl, w.shape[2:], strict=True))


def _use_mkldnn(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], nthreads: int) -> bool:
    """ATen ConvParams::use_mkldnn (inputs of 3 dims are viewed as 4-d first)."""
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    nsp = x.dim() - 2
    stride, dilation = _ints(a["stride"], nsp), _ints(a["dilation"], nsp)
    if a.get("transposed"):
        op = _ints(a.get("output_padding") or [0], nsp)
        if any(o >= s for o, s in zip(op, stride, strict=True)):
            return False
    if x.dtype == torch.bfloat16 and _avx512():
        return True
    if x.dtype != torch.float32:
        return False
    shape4 = list(x.shape) if x.dim() >= 4 else [x.shape[0], x.shape[1], 1, x.shape[2]]
    wshape = list(w.shape) if w.dim() >= 4 else [w.shape[0], w.shape[1], 1, w.shape[2]]
    kh, kw = wshape[-2], wshape[-1]
    strided = any(s != 1 for s in stride)
    dilated = any(d != 1 for d in dilation)
    first = strided or dilated or shape4[0] >= 16 or kw != 1 or kh != 1 or nthreads > 1
    second = (int(a["groups"]) > 1 or (kw > 3 and kh > 3) or shape4[0] > 1
              or _prod(shape4[:4]) > 20480)
    return first and second


def _use_channels_last(x: torch.Tensor, w: torch.Tensor) -> bool:
    """mkldnn_conv_use_channels_last: input or weight suggests channels-last (not for float64)."""
    if x.dtype == torch.float64 or x.dim() not in (4, 5):
        return False
    return any(_suggest_memory_format(t) != torch.contiguous_format for t in (x, w))


def _suggest_memory_format(t: torch.Tensor) -> torch.memory_format:
    """ATen ``Tensor::suggest_memory_format``: channels-last when the strides are channels-last-like."""
    return torch._prims_common.suggest_memory_format(t)


def _cl_format(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def _pad16(c: int) -> int:
    return _rnd(c, 16)


def _blocked_weight(g: _Conv) -> int:
    """oneDNN blocked weight (16o16i, bf16 16i pairs): channels per group rounded up to 16."""
    return g.groups * _pad16(g.oc_g) * _pad16(g.ic_g) * g.k * g.isz


def _first_conv(g: _Conv) -> bool:
    """oneDNN's "first convolution" (plain src, ic < 16).  Not for 1x1 kernels: unpadded ones take
    the 1x1 kernel with blocked src (input channels padded to 16), padded ones the gemm kernel."""
    return g.groups == 1 and g.ic < 16 and g.k > 1


def _fwd_kind(g: _Conv) -> str:
    """oneDNN forward implementation for plain (NCHW) tensors, as oneDNN picks it on AVX-512."""
    if g.depthwise:
        return "dw"
    if g.groups > 1 and (g.ic_g % 16 or g.oc_g % 16):
        return "gemm"
    if g.k == 1 and not g.pointwise:
        return "gemm"  # 1x1 kernel with padding: no jit kernel takes it
    if _first_conv(g):
        return "first"
    return "1x1" if g.pointwise else "direct"


def _gemm_col(g: _Conv, nthreads: int) -> int:
    """gemm convolution im2col buffer: ``nthreads * ic_g * k * out_spatial * 4 + 128`` (none for
    1x1 / stride 1 / no padding)."""
    if g.k == 1 and not g.strided and all(p == 0 for p in g.padding):
        return 0
    return nthreads * g.ic_g * g.k * g.out_sp * 4 + ONEDNN_ENTRY_PAD


def _padded_bias(oc: int, bias_isz: int) -> int:
    """oneDNN ``key_conv_padded_bias``: a bias whose channels are not a multiple of 16 is copied
    into a 16-padded buffer (``bias_isz``: bytes per bias element; 0 without bias)."""
    return _pad16(oc) * bias_isz + ONEDNN_ENTRY_PAD if bias_isz and oc % 16 else 0


def _gemm_wgrad_scratch(g: _Conv, nthreads: int) -> int:
    """fp32 gemm backward-weights scratchpad: im2col per thread plus a weight-reduction buffer of
    ``4 * nthr * weight bytes`` (oneDNN multiplies a byte size by ``sizeof(float)``), where ``nthr``
    is all threads when ``out_spatial / nthreads < 256`` (and batch > 1 or groups > 2), else 1
    (measured exact for 1x1 padded and 32-group convs)."""
    os_ = _prod(g.outs[-2:])
    outer = os_ // max(nthreads, 1) < 256 and (g.n != 1 or g.groups > 2)
    nthr = nthreads if outer else 1
    im2col = 0 if g.k == 1 and not g.strided and all(p == 0 for p in g.padding) else g.ic_g * g.k * g.out_sp
    col = nthr * im2col * 4 + ONEDNN_ENTRY_PAD if im2col else 0
    return col + 4 * nthr * g.weight_bytes() + ONEDNN_ENTRY_PAD


def _conv_fwd_events(g: _Conv, nthreads: int, bias_isz: int = 0) -> list[int]:
    """Allocation sequence of oneDNN convolution forward on plain tensors (incl. the dense output).

    Measured: ``[scratch, src reorder, weight reorder, blocked dst, -w, -src, -scratch, output,
    -blocked dst]``.  Blocked layouts pad channels to 16; the first conv (ic < 16, kernel > 1x1)
    reads the plain src; depthwise pads groups to 16; the gemm kernel (also any 1x1 kernel with
    padding) uses plain layouts plus im2col.  The scratchpad holds a 16-padded copy of the bias when
    ``oc % 16`` (``_padded_bias``; ``bias_isz``: bias element size, 0 without bias).
    """
    kind = _fwd_kind(g)
    out = g.act(g.oc, g.out_sp)
    if kind == "gemm":
        scratch = _gemm_col(g, nthreads)
        return [scratch, out, -scratch, out, -out]
    dst = g.act(_pad16(g.oc), g.out_sp)
    bias_pad = _padded_bias(g.oc, bias_isz)
    if kind == "first":
        ic = g.ic if g.isz == 4 else _rnd(g.ic, 2)
        w_r = _pad16(g.oc) * ic * g.k * g.isz
        return [bias_pad, w_r, dst, -w_r, -bias_pad, out, -dst]
    src = g.act(_pad16(g.ic), g.in_sp)
    w_r = _pad16(g.groups) * g.k * g.isz if kind == "dw" else _blocked_weight(g)
    scratch = bias_pad
    if kind == "1x1" and g.isz == 2:
        scratch += nthreads * _pad16(g.oc) * g.out_sp * 4 + ONEDNN_ENTRY_PAD
    if kind == "1x1" and g.strided:
        scratch += nthreads * _pad16(g.ic) * g.out_sp * g.isz + ONEDNN_ENTRY_PAD
    return [scratch, src, w_r, dst, -w_r, -src, -scratch, out, -dst]


def _cl_scratch(nthreads: int) -> int:
    return CL_BRGEMM_SCRATCH_BASE + nthreads * CL_BRGEMM_SCRATCH_PER_THREAD


def _cl_oc_pad(c: int) -> int:
    return _rnd(c, 16 if c <= 16 else 32)


def _conv_fwd_cl_events(g: _Conv, nthreads: int) -> list[int]:
    """Channels-last forward (brgemm, NHWC in place): output, scratch and a reordered weight with
    output channels padded to 16/32 (measured)."""
    out = g.act(g.oc, g.out_sp)
    w_r = g.groups * _cl_oc_pad(g.oc_g) * g.ic_g * g.k * g.isz
    scratch = _cl_scratch(nthreads)
    return [out, scratch, w_r, -w_r, -scratch]


def _brg_strided_scratch(g: _Conv, nthreads: int) -> int:
    """brgconv_strided backward-data scratchpad: ``base + nthreads * (isz * oc * out_spatial +
    20504)`` -- per thread about one image of grad_output (independent of batch and input
    channels); within ~20 % on the measured shapes (approximate)."""
    per_thread = g.isz * g.oc * g.out_sp + BRG_STRIDED_PER_THREAD
    return BRG_STRIDED_BASE.get(g.isz, 12288) + nthreads * per_thread


def _ic_block_strided(ic: int) -> int:
    return _rnd(ic, 64 if ic >= 64 else 16)


def _bwd_data_events(g: _Conv, nthreads: int, channels_last: bool) -> list[int]:
    """Allocation sequence of oneDNN backward-data producing the dense grad_input (incl. it).

    Measured: stride 1 (and depthwise): blocked grad_out / weight / grad_input like the forward.
    Stride > 1 (brgconv_strided): NHWC grad_out and grad_input, weight with input channels padded
    to 16/64, and the NHWC result made contiguous through a temporary (three grad_input-sized
    buffers at the end).  Channels-last tensors are used in place.
    """
    gx = g.act(g.ic, g.in_sp)
    kind = _fwd_kind(g)
    if kind == "gemm":
        scratch = _gemm_col(g, nthreads)
        return [gx, scratch, -scratch, gx, -gx] if not channels_last else [gx, scratch, -scratch]
    if g.strided and kind != "dw":
        oc = g.oc_g if g.isz == 4 else _rnd(g.oc_g, 2)
        w_r = g.groups * oc * _ic_block_strided(g.ic_g) * g.k * g.isz
        scratch = _brg_strided_scratch(g, nthreads)
        if channels_last:
            return [gx, w_r, scratch, -scratch, -w_r]
        gy = g.act(g.oc, g.out_sp)
        return [gy, w_r, gx, scratch, -scratch, -w_r, -gy, gx, gx, -gx, -gx]
    if channels_last:
        w_r = g.groups * g.oc_g * _cl_oc_pad(g.ic_g) * g.k * g.isz
        scratch = _cl_scratch(nthreads) + ONEDNN_ENTRY_PAD
        return [gx, w_r, scratch, -scratch, -w_r]
    gy = g.act(_pad16(g.oc), g.out_sp)
    gx_b = g.act(_pad16(g.ic), g.in_sp)
    w_r = _pad16(g.groups) * g.k * g.isz if kind == "dw" else _blocked_weight(g)
    scratch = 0
    if kind == "1x1" and g.isz == 2:
        scratch = nthreads * _pad16(g.ic) * g.in_sp * 4 + ONEDNN_ENTRY_PAD
    return [gy, w_r, gx_b, scratch, -scratch, -w_r, -gy, gx, -gx_b]


def _wgrad_balance(g: _Conv, nthreads: int, block: int, two_d: bool) -> int:
    """nthr_mb of oneDNN jit_avx512_common_conv_bwd_weights_kernel_f32::balance (direct kernels).

    Threads split minibatch (x output rows for the 2-D harness), groups, oc and ic blocks to
    minimise a memory-traffic cost, then a compute-cost pass; every minibatch thread beyond the first
    needs its own weight-gradient copy.
    """
    if nthreads < g.groups or nthreads <= 1:
        return 1
    nthr = nthreads // g.groups
    first = _first_conv(g) and g.ic in (1, 2, 3)
    ic_block = g.ic if first else block
    nb_ic = _cdiv(g.ic_g if first else _rnd(g.ic_g, block), ic_block)
    nb_oc = _cdiv(_rnd(g.oc_g, block), block)
    oh, ow = (g.outs[-2], g.outs[-1]) if len(g.outs) >= 2 else (1, g.outs[-1])
    ih, iw = (g.ins[-2], g.ins[-1]) if len(g.ins) >= 2 else (1, g.ins[-1])
    od = g.outs[0] if len(g.outs) == 3 else 1
    kd = g.ks[0] if len(g.ks) == 3 else 1
    id_ = g.ins[0] if len(g.ins) == 3 else 1
    kh, kw = (g.ks[-2], g.ks[-1]) if len(g.ks) >= 2 else (1, g.ks[-1])
    sh = g.stride[-2] if len(g.stride) >= 2 else 1
    sw, sd = g.stride[-1], (g.stride[0] if len(g.stride) == 3 else 1)
    two_d = two_d and len(g.outs) == 2 and oh > 9 and all(d == 1 for d in g.dilation)
    ih_r, oh_r = (ih, oh) if two_d else (1, 1)
    ih_n, oh_n = (1, 1) if two_d else (ih, oh)
    nthr_oh_reduce = max(1, oh_r // 9)
    groups_per_thr = 1  # oneDNN gives every group its own threads (nthr_g = ngroups)

    def mem(m: int, o: int, i: int) -> int:
        return (_cdiv(g.n * ih_r, m) * groups_per_thr * _cdiv(nb_ic, i) * ic_block * ih_n * iw * id_
                // sd // sh // sw
                + _cdiv(g.n * oh_r, m) * groups_per_thr * _cdiv(nb_oc, o) * block * oh_n * ow * od
                + 8 * groups_per_thr * _cdiv(nb_oc, o) * _cdiv(nb_ic, i) * kh * kw * kd * ic_block * block)

    def comp(m: int, o: int, i: int) -> int:
        return _cdiv(g.n * oh_r, m) * groups_per_thr * _cdiv(nb_oc, o) * _cdiv(nb_ic, i)

    mb_max = min(nthr, g.n * od * nthr_oh_reduce)
    candidates = [(m, o, min(nthr // m // o, nb_ic))
                  for m in range(1, mb_max + 1) for o in range(1, min(nthr // m, nb_oc) + 1)]
    best, best_mem = (1, 1, 1), mem(1, 1, 1)
    for cand in candidates:
        if mem(*cand) <= best_mem:
            best, best_mem = cand, mem(*cand)
    best_comp = comp(*best)
    for cand in candidates:
        c_mem, c_comp = mem(*cand), comp(*cand)
        if (c_comp <= best_comp and c_mem < 1.1 * best_mem) or 4 * c_comp <= 3 * best_comp:
            best, best_comp = cand, c_comp
    nthr_mb = best[0]
    if nthreads / 2 < nthr_mb < nthreads:
        nthr_mb = min(g.n * od * nthr_oh_reduce, nthreads)
    return nthr_mb


def _wgrad_balance_1x1(g: _Conv, nthreads: int) -> int:
    """nthr_mb of oneDNN's 1x1 backward-weights balance (reduction over the whole output plane)."""
    if nthreads < g.groups or nthreads <= 1:
        return 1
    nthr = nthreads // g.groups
    nb_ic, nb_oc = _cdiv(g.ic_g, 16), _cdiv(g.oc_g, 16)
    rb = g.out_sp

    def mem(m: int, o: int, i: int) -> int:
        return (_cdiv(g.n, m) * _cdiv(nb_ic, i) * 16 * rb + _cdiv(g.n, m) * _cdiv(nb_oc, o) * 16 * rb
                + 12 * _cdiv(nb_oc, o) * _cdiv(nb_ic, i) * 256)

    best, best_mem = (1, 1, 1), mem(1, 1, 1)
    for m in range(1, min(nthr, g.n) + 1):
        for o in range(1, min(nthr // m, nb_oc) + 1):
            cand = (m, o, min(nthr // m // o, nb_ic))
            if mem(*cand) <= best_mem:
                best, best_mem = cand, mem(*cand)
    nthr_mb = best[0]
    if nthreads / 2 < nthr_mb < nthreads:
        nthr_mb = min(g.n, nthreads)
    return nthr_mb


def _wgrad_events(g: _Conv, nthreads: int, bias_channels: int, channels_last: bool) -> list[int]:
    """Allocation sequence of oneDNN backward-weights, ending with dense grad_weight (and bias).

    Measured: reorders of grad_out and input to the blocked layout (none for channels-last
    tensors nor for the first conv's plain src), a blocked grad_weight, the scratchpad, the bias
    gradient, then the dense grad_weight (always produced, even if only grad_bias is requested; for
    channels-last also its ``.to(channels_last)`` copy).  Scratchpad: when oneDNN's balancer splits
    the minibatch over ``nthr_mb > 1`` threads, ``(nthr_mb - 1)`` extra fp32 weight(+bias) copies
    plus 8320 bytes; 1x1 kernels with stride also keep a per-thread reduced-stride input, 1x1
    kernels with bias a bias reducer; the AVX2 kernel (first conv, 4 <= ic < 16) weight and bias
    reducers; gemm an im2col and weight-reduction buffer (``_wgrad_scratch``).
    """
    with_bias = bias_channels > 0
    gw = g.weight_bytes()
    gb = gb_b = bias_channels * g.isz
    kind = _fwd_kind(g)
    if kind == "gemm":
        col = _gemm_wgrad_scratch(g, nthreads) if g.isz == 4 else _gemm_col(g, nthreads)
        return [gw, col, gb_b, -col, gb, gw, -gw, -gb_b]
    block = 16
    if _first_conv(g) and g.ic not in (1, 2, 3) and g.isz == 4 and not channels_last:
        block = 8  # oneDNN falls back to the AVX2 kernel with 8-channel blocks
    first_plain = _first_conv(g) and (g.ic in (1, 2, 3) or channels_last)
    if kind == "dw":
        gw_b = _pad16(g.groups) * g.k * 4
    elif first_plain:
        gw_b = _pad16(g.oc) * g.ic * g.k * 4
    else:
        gw_b = g.groups * _rnd(g.oc_g, block) * _rnd(g.ic_g, block) * g.k * 4
    if g.isz == 2:
        gw_b //= 2
    gy_r = x_r = 0
    if not channels_last:
        gy_r = g.act(_rnd(g.oc, block), g.out_sp)
        x_r = 0 if first_plain else g.act(_rnd(g.ic, block), g.in_sp)
    scratch = 0 if kind == "dw" else _wgrad_scratch(g, nthreads, gw_b, block, with_bias, channels_last)
    tail = [gb, gw, gw, -gw, -gw_b, -gb_b] if channels_last else [gb, gw, -gw_b, -gb_b]
    return [gy_r, x_r, gw_b, scratch, gb_b, -scratch, -x_r, -gy_r, *tail]


def _reducer(nthr: int, job: int, njobs: int, reduction: int, max_buffer: int) -> int:
    """Scratchpad of a oneDNN ``cpu_reducer_t`` (``reduce_balancer_t::balance``, lock-free).

    Threads are split into ``ngroups`` groups of ``nthr_per_group`` over ``njobs`` jobs of ``job``
    floats reduced over ``reduction``; only with ``nthr_per_group > 1`` it books
    ``ngroups * (nthr_per_group - 1) * njobs_per_group * job`` floats plus barriers:
    ``space + 8192 + 4096 * ngroups`` bytes (the constants measured: page-aligned space and barrier
    contexts; exact on 1-4 threads, 1-3 groups).
    """
    if nthr <= 1 or njobs <= 0 or reduction <= 0:
        return 0
    max_njobs = max(1, max_buffer // (nthr * job))
    min_njobs = max(1, njobs // nthr)
    ngroups = min(njobs // min_njobs, nthr)
    per_group = min(nthr // ngroups, reduction)
    ub = _cdiv(njobs, ngroups)
    complexity = njobs * job * reduction
    for c_njobs in range(min_njobs, njobs):
        c_ngroups = min(njobs // c_njobs, nthr)
        c_per_group = min(nthr // c_ngroups, reduction)
        c_ub = _cdiv(njobs, c_ngroups)
        if c_per_group > 1 and c_ub > max_njobs:
            continue
        c_complexity = job * c_ub * (_cdiv(reduction, c_per_group) + (c_per_group != 1))
        if c_complexity < complexity:
            ngroups, per_group, ub, complexity = c_ngroups, c_per_group, c_ub, c_complexity
    if per_group == 1:
        return 0
    return ngroups * (per_group - 1) * ub * job * 4 + 8192 + 4096 * ngroups


def _bias_reducer(g: _Conv, nthreads: int) -> int:
    """1x1 backward-weights bias reducer: jobs of 16 channels, reduced over the minibatch."""
    return _reducer(nthreads, 16, g.groups * _cdiv(g.oc_g, 16), g.n, nthreads * 3 * 5 * 5 * 16 * 16)


def _avx2_wgrad_scratch(g: _Conv, nthreads: int, with_bias: bool) -> int:
    """AVX2 backward-weights kernel (8-channel blocks, oneDNN's fallback for the first conv with
    4 <= ic < 16): a weight reducer (jobs of one 8o8i kernel block, reduced over minibatch x depth)
    and a bias reducer (jobs of 8 channels, over the minibatch), both ``cpu_reducer_t``."""
    od = g.outs[0] if len(g.outs) == 3 else 1
    njobs_w = g.groups * _cdiv(g.ic_g, 8) * _cdiv(g.oc_g, 8)
    wei = _reducer(nthreads, g.k * 64, njobs_w, g.n * od, 1 << 21)
    bias = _reducer(nthreads, 8, g.groups * _cdiv(g.oc_g, 8), g.n, 1 << 21) if with_bias else 0
    return wei + bias


def _wgrad_scratch(g: _Conv, nthreads: int, gw_b: int, block: int, with_bias: bool, channels_last: bool) -> int:
    """oneDNN backward-weights scratchpad (``gw_b``: bytes of the blocked weight gradient).

    fp32: ``(nthr_mb - 1)`` weight(+bias) reduction copies + 8320 bytes when the balancer splits
    the minibatch (exact), a padded bias when oc is not a multiple of the block, and for strided 1x1
    kernels a per-thread reduced-stride input.  1x1 kernels with bias also book the padded bias and
    the bias reducer (``_bias_reducer``).  bf16 (approximate): fp32 accumulators and per-thread
    transposed copies of one image of input and grad_output.
    """
    one_by_one = _fwd_kind(g) == "1x1"
    bias_1x1 = _padded_bias(g.oc, 4) + _bias_reducer(g, nthreads) if one_by_one and with_bias else 0
    if g.isz == 2 and one_by_one:
        strided = nthreads * _pad16(g.oc) * g.out_sp * 4 if g.strided else 0
        return nthreads * gw_b * 2 + BF16_WGRAD_1X1_OVERHEAD + strided + bias_1x1
    if g.isz == 2:
        nthr_mb = _wgrad_balance(g, nthreads, block, two_d=not channels_last)
        transposed = 2 * (_pad16(g.ic) * g.in_sp + _pad16(g.oc) * g.out_sp)
        return nthr_mb * (gw_b * 2 + transposed + BF16_WGRAD_PER_THREAD)
    padded_bias = _rnd(g.oc, block) * 4 + ONEDNN_ENTRY_PAD if with_bias and g.oc % block else 0
    if block == 8:
        return _avx2_wgrad_scratch(g, nthreads, with_bias) + padded_bias
    if one_by_one:
        nthr_mb = _wgrad_balance_1x1(g, nthreads)
        reduction = (nthr_mb - 1) * gw_b + WGRAD_REDUCTION_OVERHEAD if nthr_mb > 1 else 0
        rtus = nthreads * _pad16(g.ic) * g.out_sp * 4 + ONEDNN_ENTRY_PAD if g.strided else 0
        return reduction + rtus + bias_1x1
    nthr_mb = _wgrad_balance(g, nthreads, block, two_d=not channels_last)
    bias_pad = g.groups * _rnd(g.oc_g, block) * 4
    reduction = (nthr_mb - 1) * (gw_b + bias_pad) + WGRAD_REDUCTION_OVERHEAD if nthr_mb > 1 else 0
    return reduction + padded_bias


def _slow_path_columns(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_sp: Sequence[int],
                       backend: str, transposed: bool) -> int:
    """im2col columns of the slow (THNN) convolution paths, forward and backward alike."""
    if transposed:
        g = _transposed_as_conv(x, w, a, out_sp)
        return g.ic_g * g.k * _prod(x.shape[2:]) * g.isz
    return _slow_columns(_conv_geometry(x, w, a, out_sp), backend)


def _slow_columns(g: _Conv, backend: str) -> int:
    """THNN im2col/col2im ``columns``: whole batch for slow_conv2d/3d, one image for the dilated and
    transposed kernels; none for 1x1 / stride 1 / no padding."""
    if g.k == 1 and not g.strided and all(p == 0 for p in g.padding) and backend != "slow_transpose":
        return 0
    per_image = g.ic_g * g.k * g.out_sp * g.isz
    return per_image * (g.n if backend in ("slow", "slow3d") else 1)


def _conv_backend(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], nthreads: int) -> str:
    if x.numel() == 0 or w.numel() == 0:
        return "empty"
    if _use_mkldnn(x, w, a, nthreads):
        return "mkldnn"
    if a.get("transposed"):
        return "slow_transpose"
    if x.dim() == 5:
        return "slow3d"
    nsp = x.dim() - 2
    return "slow_dilated" if any(d != 1 for d in _ints(a["dilation"], nsp)) else "slow"


def _slow_format(x: torch.Tensor, w: torch.Tensor, backend: str) -> torch.memory_format:
    """THNN slow_conv2d / dilated kernels run channels-last when input or weight is channels-last."""
    if backend in ("slow", "slow_dilated") and x.dim() == 4 and _use_channels_last(x, w):
        return torch.channels_last
    return torch.contiguous_format


def _input_copies(tensors: Iterable[torch.Tensor | None], fmt: torch.memory_format) -> int:
    """``.contiguous(memory_format)`` copies ATen makes before calling the backend."""
    total = 0
    for t in tensors:
        if t is None or t.dim() < 3:
            continue
        layout = fmt if t.dim() in (4, 5) else torch.contiguous_format
        if layout == torch.channels_last and t.dim() == 5:
            layout = torch.channels_last_3d
        if not t.is_contiguous(memory_format=layout):
            total += _nbytes(t)
    return total


def _convolution(c: _Call) -> int:
    """convolution.default.

    mkldnn (oneDNN) path -- fp32 unless a 1x1 unstrided conv with batch < 16 runs single-threaded
    or batch 1 with small kernels; bf16 always (AVX-512): see ``_conv_fwd_events`` (plain tensors),
    ``_conv_fwd_cl_events`` (channels-last) and, for transposed convs (oneDNN runs backward-data),
    ``_bwd_data_events``.  THNN paths: the im2col ``columns`` buffer.  Non-contiguous inputs are
    copied first (to channels-last when the input or weight is channels-last).
    """
    x, w = c.tensor("input"), c.tensor("weight")
    if x is None or w is None:
        return 0
    a = c.args
    out_sp = _conv_out_spatial(x, w, a)
    backend = _conv_backend(x, w, a, c.nthreads)
    transposed = bool(a.get("transposed"))
    out_channels = w.shape[1] * int(a["groups"]) if transposed else w.shape[0]
    out_bytes = x.shape[0] * out_channels * _prod(out_sp) * x.element_size()
    if backend == "empty":
        return 0
    if backend != "mkldnn":
        copies = _input_copies((x, w), _slow_format(x, w, backend))
        cols = _slow_path_columns(x, w, a, out_sp, backend, transposed)
        group_tmp = out_bytes if int(a["groups"]) > 1 else 0
        return copies + cols + group_tmp
    channels_last = _use_channels_last(x, w) and not transposed
    fmt = _cl_format(x) if channels_last else torch.contiguous_format
    copies = _input_copies((x, w), fmt)
    if transposed:
        g = _transposed_as_conv(x, w, a, out_sp)
        events = _bwd_data_events(g, c.nthreads, channels_last=False)
    elif channels_last:
        events = _conv_fwd_cl_events(_conv_geometry(x, w, a, out_sp), c.nthreads)
    else:
        bias = c.tensor("bias")
        bias_isz = 0 if bias is None else bias.element_size()
        events = _conv_fwd_events(_conv_geometry(x, w, a, out_sp), c.nthreads, bias_isz)
    return copies + max(_peak(events) - out_bytes, 0)


def _transposed_as_conv(x: torch.Tensor, w: torch.Tensor, a: Mapping[str, Any], out_sp: Sequence[int]) -> _Conv:
    """A transposed conv (input x, weight [ic, oc/g, k]) as the forward conv it is the gradient of:
    conv input = the transposed conv's output, conv output = x."""
    nsp = x.dim() - 2
    groups = int(a["groups"])
    return _Conv(
        n=x.shape[0], ic=w.shape[1] * groups, oc=x.shape[1], ins=tuple(out_sp), outs=tuple(x.shape[2:]),
        ks=tuple(w.shape[2:]), stride=_ints(a["stride"], nsp), padding=_ints(a["padding"], nsp),
        dilation=_ints(a["dilation"], nsp), groups=groups, isz=x.element_size(),
    )


def _convolution_backward(c: _Call) -> int:
    """convolution_backward.default.

    oneDNN: backward-data (if grad_input requested, ``_bwd_data_events``) then backward-weights
    (if grad_weight or grad_bias requested, ``_wgrad_events``, which always produces grad_weight).
    The transient is the peak of that sequence minus the requested outputs, plus ``.contiguous``
    copies of grad_output / input / weight.  A transposed conv swaps the roles (its backward-data is
    a forward conv).  THNN: one ``columns`` buffer (allocated in turn for grad_input and
    grad_weight).
    """
    gy, x, w = c.tensor("grad_output"), c.tensor("input"), c.tensor("weight")
    if gy is None or x is None or w is None:
        return 0
    a = c.args
    mask = list(c.args.get("output_mask") or [True, True, True])
    with_bias = bool(mask[2])
    transposed = bool(a.get("transposed"))
    backend = _conv_backend(x, w, a, c.nthreads)
    if backend == "empty":
        return 0
    out_sp = tuple(gy.shape[2:])
    bias_channels = gy.shape[1]
    requested = (_nbytes(x) if mask[0] else 0) + (_nbytes(w) if mask[1] else 0)
    requested += bias_channels * gy.element_size() if mask[2] else 0
    if backend != "mkldnn":
        copies = _input_copies((gy, x, w), _slow_format(x, w, backend))
        cols = _slow_path_columns(x, w, a, out_sp, backend, transposed)
        return copies + (cols if (mask[0] or mask[1]) else 0)
    channels_last = _use_channels_last(x, w) and not transposed
    fmt = _cl_format(x) if channels_last else torch.contiguous_format
    copies = _input_copies((gy, x, w), fmt)
    events: list[int] = []
    if transposed:
        # grad_input of a transposed conv is the forward conv it is the gradient of (input =
        # grad_output); its weight gradient is that conv's, with the bias over grad_output channels.
        g = _transposed_as_conv(x, w, a, out_sp)
        if mask[0]:
            events += _conv_fwd_events(g, c.nthreads)
        if mask[1] or mask[2]:
            events += _wgrad_events(g, c.nthreads, g.ic if with_bias else 0, channels_last=False)
    else:
        g = _conv_geometry(x, w, a, out_sp)
        if mask[0]:
            events += _bwd_data_events(g, c.nthreads, channels_last)
        if mask[1] or mask[2]:
            events += _wgrad_events(g, c.nthreads, g.oc if with_bias else 0, channels_last)
    return copies + max(_peak(events) - requested, 0)


# --------------------------------------------------------------------------------------------
# rule table
# --------------------------------------------------------------------------------------------


def _rule_table() -> Mapping[str, Rule]:
    table: dict[str, Rule] = {}
    for name in _POINTWISE:
        table[name] = _pointwise
        table[name + "_"] = _pointwise
    for name in ("sum", "nansum", "prod", "amax", "amin", "any", "all", "cumsum", "cumprod"):
        table[name] = _reduction
    table["cumsum_"] = _reduction
    table["mean"] = _mean
    for name in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                 "_native_batch_norm_legit_no_training"):
        table[name] = _batch_norm
    table["native_batch_norm_backward"] = _batch_norm_backward
    table["native_group_norm"] = _group_norm
    table["native_group_norm_backward"] = _group_norm_backward
    table["native_layer_norm"] = _layer_norm
    table["native_layer_norm_backward"] = _layer_norm_backward
    for name in ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"):
        table[name] = _softmax
    table["native_dropout"] = _native_dropout
    table["sort"] = _sort
    table["argsort"] = _sort
    for name in ("index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put"):
        table[name] = _index_int32
    for name in _UPSAMPLE_TAPS:
        table[name] = _upsample
    table["repeat"] = _repeat
    for name in ("embedding", "embedding_dense_backward", "index_select"):
        table[name] = _embedding
    for name in ("mm", "addmm", "bmm", "baddbmm"):
        table[name] = _matmul
    table["convolution"] = _convolution
    table["convolution_backward"] = _convolution_backward
    return types.MappingProxyType(table)


_RULES: Mapping[str, Rule] = _rule_table()


def _is_out_variant(op: torch._ops.OpOverload) -> bool:
    return any(arg.is_out for arg in op._schema.arguments)


def _workspace_ops() -> frozenset[str]:
    names: set[str] = set()
    for family in _RULES:
        packet = getattr(aten, family, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if _is_out_variant(op) or not any("Tensor" in str(a.type) for a in op._schema.arguments):
                continue
            names.add(f"aten.{family}.{overload}")
    return frozenset(names)


WORKSPACE_OPS: frozenset[str] = _workspace_ops()
"""``str(op)`` of every overload with a (possibly) nonzero rule, e.g. ``"aten.convolution.default"``."""


def cpu_workspace_bytes(
    op: torch._ops.OpOverload, args: tuple, kwargs: dict, outputs: Sequence[torch.Tensor]
) -> int:
    """Transient CPU allocator bytes the op takes beyond its outputs while it runs.

    ``args``/``kwargs`` are the op's arguments with tensors as meta tensors (shape, dtype and
    strides matter), ``outputs`` its (meta) output tensors.  Unknown ops return 0.  The thread
    count is ``torch.get_num_threads()``.
    """
    if op._schema.name.split("::")[0] != "aten":
        return 0
    rule = _RULES.get(op._schema.name.split("::")[-1])
    if rule is None or _is_out_variant(op):
        return 0
    outs = tuple(o for o in outputs if isinstance(o, torch.Tensor))
    call = _Call(op=op, args=_bind(op, tuple(args), dict(kwargs)), outputs=outs,
                 nthreads=torch.get_num_threads())
    return max(int(rule(call)), 0)
