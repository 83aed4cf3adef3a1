"""Rules of element-wise ops (with broadcasting) and of factories.

Element-wise: every output dimension is a label; each tensor argument is
aligned with the output from the right and shares its labels, except
broadcast (size-1) dimensions, which are None. In-place variants are the
same: their written `self` has the output's shape, so it carries every label
and the slices written through narrow() views land in the original.
"""

from __future__ import annotations

from peakcut.ir.dims.call import Builder, Call, Labeling, aten
from peakcut.ir.dims.shapes import broadcast, names
from peakcut.ir.node import TensorRef


def elementwise(call: Call) -> Labeling:
    out = names(len(call.out))
    tensors = {name: broadcast(call.shape(name), call.out, out)
               for name, value in call.args.items() if isinstance(value, TensorRef)}
    return Labeling(tensors, [out])


def triangle(call: Call) -> Labeling:
    """triu, tril: the matrix dimensions (last two) stay whole; batch dimensions are labels."""
    out = names(len(call.out))[:-2] + (None, None)
    return Labeling({"self": out}, [out])


def sized_factory(call: Call) -> Labeling:
    """zeros/ones/full/empty/new_*(size): output dimensions are tied to the `size` entries.

    A `self` argument (new_zeros etc.) only gives dtype and device: shared whole.
    """
    out = names(len(call.out))
    return Labeling({}, [out], sizes={"size": out})


def scalar(call: Call) -> Labeling:
    """scalar_tensor: a 0-d output, nothing to split."""
    return Labeling({}, [()])


def arange(call: Call) -> Labeling:
    """arange: part p would need start + p*len/n; not a size division, so never split."""
    return Labeling({}, [(None,)])


_ELEMENTWISE = (
    "abs", "acos", "acosh", "add.Tensor", "add.Scalar", "add_.Tensor", "add_.Scalar", "addcdiv",
    "addcmul", "addcdiv_", "addcmul_", "asin", "atan", "atan2", "bitwise_and.Tensor",
    "bitwise_not", "bitwise_or.Tensor", "ceil", "clamp", "clamp_min", "clamp_max", "cos", "cosh",
    "div.Tensor", "div.Scalar", "div.Tensor_mode", "div_.Tensor", "div_.Scalar", "eq.Scalar",
    "eq.Tensor", "erf", "erfinv", "exp", "exp2", "expm1", "floor", "fmod.Scalar", "fmod.Tensor",
    "ge.Scalar", "ge.Tensor", "gelu", "gelu_backward", "elu", "elu_backward", "gt.Scalar", "gt.Tensor", "hardtanh",
    "hardtanh_backward", "isinf", "isnan", "le.Scalar", "le.Tensor", "leaky_relu",
    "leaky_relu_backward", "lerp.Scalar", "lerp.Tensor", "lerp_.Scalar", "lerp_.Tensor", "log",
    "log1p", "log2", "logical_and", "logical_not", "logical_or", "lt.Scalar", "lt.Tensor",
    "maximum", "minimum", "mul.Tensor", "mul.Scalar", "mul_.Tensor", "mul_.Scalar", "ne.Scalar",
    "ne.Tensor", "neg", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "reciprocal",
    "relu", "relu_", "remainder.Scalar", "remainder.Tensor", "round", "rsqrt", "rsub.Scalar",
    "rsub.Tensor", "sigmoid", "sigmoid_backward", "sign", "silu", "silu_backward", "sin", "sinh",
    "sqrt", "sub.Tensor", "sub.Scalar", "sub_.Tensor", "tan", "tanh", "tanh_backward",
    "threshold_backward", "trunc", "where.self", "where.ScalarSelf", "where.ScalarOther",
    "where.Scalar", "masked_fill.Scalar", "masked_fill.Tensor", "fill.Scalar", "fill_.Scalar",
    "fill.Tensor", "sgn", "square", "logit_backward", "_to_copy", "clone", "copy", "copy_",
    "zero_", "lift_fresh_copy", "full_like", "zeros_like", "ones_like", "empty_like",
)


BUILDERS: dict[str, Builder] = {
    **{aten(n): elementwise for n in _ELEMENTWISE},
    "aten.triu.default": triangle,
    "aten.tril.default": triangle,
    **{aten(n): sized_factory for n in (
        "empty.memory_format", "empty_strided", "full", "zeros", "ones",
        "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided")},
    "aten.scalar_tensor.default": scalar,
    "aten.arange.default": arange,
    "aten.arange.start": arange,
    "aten.arange.start_step": arange,
}
