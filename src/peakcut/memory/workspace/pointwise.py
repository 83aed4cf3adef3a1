"""TensorIterator pointwise ops: type-promotion casts and wrapped Python scalars.

Measured: each operand whose dtype differs from the common dtype is cast first; a Python
number given for a tensor operand is wrapped into a 0-dim tensor and cast too; an in-place
op whose ``self`` dtype differs from the common dtype computes into a temporary.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

import torch

from peakcut.memory.workspace.call import OpCall, Rule, itemsize


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


def _result_type(operands: Sequence[torch.Tensor | bool | int | float | complex],
                 default: torch.dtype) -> torch.dtype:
    """torch.result_type over several operands (dim tensors > 0-dim tensors > Python numbers);
    `default`: torch's default float dtype."""
    tiers: list[torch.dtype | None] = [None, None, None]
    for v in operands:
        if isinstance(v, torch.Tensor):
            tier, dt = (0 if v.dim() > 0 else 1), v.dtype
        else:
            tier, dt = 2, _scalar_dtype(v)
            if dt.is_floating_point:
                dt = default
            elif dt.is_complex:
                dt = torch.complex64 if default == torch.float32 else torch.complex128
        current = tiers[tier]
        tiers[tier] = dt if current is None else torch.promote_types(current, dt)
    result = _combine(tiers[0], _combine(tiers[1], tiers[2]))
    return result if result is not None else default


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


def pointwise(c: OpCall) -> int:
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
            wrapped += itemsize(_scalar_dtype(value))
    if not operands:
        return 0
    out = c.out()
    promote = base in _COMPARISON or inplace
    common = _result_type(operands, c.machine.default_dtype) if promote or out is None else out.dtype
    casts = 0
    for v in operands:
        dt = v.dtype if isinstance(v, torch.Tensor) else _scalar_dtype(v)
        if dt != common:
            numel = v.numel() if isinstance(v, torch.Tensor) else 1
            casts += numel * itemsize(common)
    self_t = c.tensor("self")
    if inplace and self_t is not None and self_t.dtype != common:
        casts += self_t.numel() * itemsize(common)
    return wrapped + casts


RULES: Mapping[str, Rule] = types.MappingProxyType(
    {name: pointwise for family in _POINTWISE for name in (family, family + "_")})
