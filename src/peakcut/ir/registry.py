"""The op registry: per-op facts the analyses and rules rely on.

An op that is not in the registry is *opaque*: it is captured, simulated and
run like any other op, but no transformation ever touches it.

Facts kept here:
- flops: from torch.utils.flop_counter's registry where PyTorch knows the op
  (matmuls, convolutions, attention), else one FLOP per output element for
  element-wise and reduction ops, else 0 (views, copies);
- bytes moved: inputs read + outputs written;
- random: the op draws from the RNG (never duplicated or split, docs/design.md: randomness);
- mutated arguments: read from the op's schema (alias_info.is_write);
- workspace: not here (peakcut.memory.workspace, per machine);
- dimension rules: peakcut.ir.dims, for fission.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from types import MappingProxyType
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from peakcut.ir.sparse_ops import SPMM_OP, spmm_flops, spmm_gathered_bytes

aten = torch.ops.aten


def resolve_op(name: str) -> torch._ops.OpOverload:
    """'aten.mm.default' -> torch.ops.aten.mm.default; clear error if it does not exist."""
    parts = name.split(".")
    if len(parts) != 3:
        raise ValueError(f"op name {name!r} is not of the form 'namespace.op.overload'")
    ns, op, overload = parts
    try:
        found: torch._ops.OpOverload = getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError) as e:
        raise ValueError(f"op {name!r} is not registered with PyTorch ({e})") from None
    return found


class OpKind(str, Enum):
    """Coarse class of an op, used for cost and (later) rule matching."""

    VIEW = "view"              # returns an alias: no data moved
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    CONV = "conv"
    NORM = "norm"
    DATA_MOVEMENT = "data_movement"  # copies, concatenation, gathers, scatters
    FACTORY = "factory"        # creates a tensor from nothing (zeros, full, arange)
    RANDOM = "random"
    OPTIMIZER = "optimizer"    # in-place updates typical of optimizer steps
    SWAP = "swap"              # peakcut.store / load / writeback: copies between device and host


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What peakcut knows about one op overload (by its 'aten.x.overload' name)."""

    name: str
    kind: OpKind

    @property
    def random(self) -> bool:
        return self.kind is OpKind.RANDOM


_VIEW = ["alias", "as_strided", "detach", "expand", "permute", "select.int", "slice.Tensor", "squeeze.dim", "squeeze.dims", "squeeze.default", "t", "transpose.int", "unsqueeze", "view", "_unsafe_view", "unbind.int", "split.Tensor", "split_with_sizes", "diagonal", "view_as_real", "view_as_complex", "unfold", "narrow"]

_ELEMENTWISE = ["abs", "acos", "acosh", "add.Tensor", "add.Scalar", "add_.Tensor", "add_.Scalar", "addcdiv", "addcmul", "addcdiv_", "addcmul_", "asin", "atan", "atan2", "bitwise_and.Tensor", "bitwise_not", "bitwise_or.Tensor", "ceil", "clamp", "clamp_min", "clamp_max", "cos", "cosh", "div.Tensor", "div.Scalar", "div.Tensor_mode", "div_.Tensor", "div_.Scalar", "eq.Scalar", "eq.Tensor", "erf", "erfinv", "exp", "exp2", "expm1", "floor", "fmod.Scalar", "fmod.Tensor", "ge.Scalar", "ge.Tensor", "gelu", "gelu_backward", "elu", "elu_backward", "gt.Scalar", "gt.Tensor", "hardtanh", "hardtanh_backward", "isinf", "isnan", "le.Scalar", "le.Tensor", "leaky_relu", "leaky_relu_backward", "lerp.Scalar", "lerp.Tensor", "lerp_.Scalar", "lerp_.Tensor", "log", "log1p", "log2", "logical_and", "logical_not", "logical_or", "lt.Scalar", "lt.Tensor", "maximum", "minimum", "mul.Tensor", "mul.Scalar", "mul_.Tensor", "mul_.Scalar", "ne.Scalar", "ne.Tensor", "neg", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "reciprocal", "relu", "relu_", "remainder.Scalar", "remainder.Tensor", "round", "rsqrt", "rsub.Scalar", "rsub.Tensor", "sigmoid", "sigmoid_backward", "sign", "silu", "silu_backward", "sin", "sinh", "sqrt", "sub.Tensor", "sub.Scalar", "sub_.Tensor", "tan", "tanh", "tanh_backward", "threshold_backward", "trunc", "where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", "masked_fill.Scalar", "masked_fill.Tensor", "fill.Scalar", "fill_.Scalar", "fill.Tensor", "sgn", "square", "logit_backward", "_to_copy", "clone", "copy", "copy_", "zero_", "triu", "tril"]

_REDUCTION = ["sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax", "amin", "max.dim", "min.dim", "argmax", "argmin", "var.correction", "var_mean.correction", "prod.dim_int", "prod.default", "cumsum", "any.dim", "any.dims", "all.dim", "logsumexp", "norm.ScalarOpt_dim", "_log_softmax", "_softmax", "_safe_softmax", "_log_softmax_backward_data", "_softmax_backward_data"]

# The CPU's fused attention (what F.scaled_dot_product_attention, transformers' default "sdpa",
# dispatches to on a CPU) and its backward; with dropout_p > 0 draws_random keeps them whole.
_CPU_ATTENTION = ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"]
_MATMUL = ["mm", "addmm", "addmm_", "bmm", "baddbmm", "dot", "mv", "_scaled_dot_product_efficient_attention", *_CPU_ATTENTION]
_CONV = ["convolution", "convolution_backward"]
_NORM = ["native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional", "native_group_norm", "native_group_norm_backward"]

_DATA_MOVEMENT = ["cat", "stack", "constant_pad_nd", "gather", "scatter.src", "scatter.value", "scatter_add", "scatter_reduce.two", "index.Tensor", "index_put", "index_put_", "index_select", "index_add", "index_add_", "embedding", "embedding_dense_backward", "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "upsample_nearest2d.vec", "upsample_bilinear2d.vec", "upsample_nearest2d_backward", "upsample_bilinear2d_backward", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "slice_backward", "select_backward", "lift_fresh_copy", "select_scatter", "slice_scatter", "flip", "roll", "repeat", "sort", "topk", "col2im", "im2col", "reflection_pad2d", "replication_pad2d"]

_FACTORY = ["empty.memory_format", "empty_strided", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty_like", "scalar_tensor", "arange.start_step", "arange.default", "arange.start", "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided"]

_RANDOM = ["native_dropout", "native_dropout_backward", "bernoulli.p", "bernoulli.default", "bernoulli_.float",
           "bernoulli_.Tensor", "rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "normal_", "uniform_", "exponential_", "multinomial", "randperm"]

_OPTIMIZER = ["_foreach_add_.List", "_foreach_mul_.Scalar"]


def _with_default(names: Sequence[str]) -> list[str]:
    """'mm' -> 'aten.mm.default'; 'add.Tensor' -> 'aten.add.Tensor'."""
    return [f"aten.{n}" if "." in n else f"aten.{n}.default" for n in names]


def _build() -> Mapping[str, OpInfo]:
    table: dict[str, OpInfo] = {}
    for kind, names in (
        (OpKind.VIEW, _VIEW), (OpKind.ELEMENTWISE, _ELEMENTWISE), (OpKind.REDUCTION, _REDUCTION),
        (OpKind.MATMUL, _MATMUL), (OpKind.CONV, _CONV), (OpKind.NORM, _NORM),
        (OpKind.DATA_MOVEMENT, _DATA_MOVEMENT), (OpKind.FACTORY, _FACTORY),
        (OpKind.RANDOM, _RANDOM), (OpKind.OPTIMIZER, _OPTIMIZER),
    ):
        for name in _with_default(names):
            table[name] = OpInfo(name, kind)
    from peakcut.ir.guards import NONZERO_COUNTED_OP
    from peakcut.ir.ops import COPY_DIRECTION, GATE_OP, RNG_STATE_OPS

    for name in (SPMM_OP, NONZERO_COUNTED_OP):      # a sparse matrix's product; a specialised nonzero
        table[name] = OpInfo(name, OpKind.DATA_MOVEMENT)

    for name in COPY_DIRECTION:
        table[name] = OpInfo(name, OpKind.SWAP)
    table[GATE_OP] = OpInfo(GATE_OP, OpKind.OPTIMIZER)
    for name in RNG_STATE_OPS:      # a generator's state read or set: ordered with the draws
        table[name] = OpInfo(name, OpKind.RANDOM)
    return MappingProxyType(table)


REGISTRY: Mapping[str, OpInfo] = _build()


def lookup(op: str) -> OpInfo | None:
    """The registry entry of an op, or None if the op is opaque to peakcut."""
    return REGISTRY.get(op)


def draws_random(op: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call draws from the random generator: a random op of the registry, an op with
    a dropout_p argument > 0 (attention kernels), or any other op PyTorch tags
    nondeterministic_seeded (randint.low, normal.Tensor_float, rrelu_with_noise, ...). Such
    calls keep their relative order and are never duplicated."""
    info = REGISTRY.get(op)
    if info is not None and info.random:
        return True
    try:
        names = argument_names(op)
    except ValueError:
        return False
    if "dropout_p" in names:      # tagged seeded, but draws only with a dropout
        values = dict(zip(names, args, strict=False)) | dict(kwargs)
        p = values.get("dropout_p", 0.0)
        return isinstance(p, (int, float)) and float(p) > 0
    return _seeded(op)


@cache
def _seeded(op: str) -> bool:
    """Whether PyTorch tags the op as drawing from a random generator."""
    return torch.Tag.nondeterministic_seeded in resolve_op(op).tags


def is_opaque(op: str) -> bool:
    return op not in REGISTRY


# Ops that write arguments their schema does not mark as written (alias_info.is_write).
# native_batch_norm updates running_mean/running_var in training mode.
_UNDECLARED_WRITES: Mapping[str, frozenset[str]] = MappingProxyType({
    "aten.native_batch_norm.default": frozenset({"running_mean", "running_var"}),
})


@cache
def mutated_arguments(op: str) -> frozenset[str]:
    """Names of the op's arguments it writes in place: the schema's, plus known undeclared ones."""
    schema = resolve_op(op)._schema
    declared = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    return frozenset(declared | _UNDECLARED_WRITES.get(op, frozenset()))


def bind_arguments(schema_args: Sequence[Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every schema argument by name: given positionally, by keyword, or its default (else None)."""
    bound: dict[str, Any] = {}
    for i, a in enumerate(schema_args):
        if i < len(args) and not a.kwarg_only:
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
        else:
            bound[a.name] = None
    return bound


@cache
def argument_names(op: str) -> tuple[str, ...]:
    """Names of the op's arguments, in schema order."""
    return tuple(a.name for a in resolve_op(op)._schema.arguments)


def _shapes(args: tuple[Any, ...]) -> list[tuple[int, ...]]:
    return [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]


# FLOP rules of ops torch.utils.flop_counter does not list, from the shapes of their tensor
# arguments: the CPU's fused attention counts as the same shapes' flash attention; an
# in-place addmm_ (a fission part accumulating its product, peakcut.fission.accumulate) as addmm.
_MORE_FLOP_RULES: Mapping[str, Callable[[list[tuple[int, ...]]], int]] = MappingProxyType({
    "aten.addmm_.default": lambda shapes: 2 * shapes[1][0] * shapes[1][1] * shapes[2][1],
    "aten._scaled_dot_product_flash_attention_for_cpu.default":
        lambda shapes: sdpa_flop_count(*shapes[:3]),  # type: ignore[no-untyped-call]
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default":
        lambda shapes: sdpa_backward_flop_count(*shapes[:4]),  # type: ignore[no-untyped-call]
    SPMM_OP: spmm_flops,        # 2 * nnz * width (peakcut.ir.sparse_ops)
})


def flops(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
          outputs: Sequence[torch.Tensor | None]) -> int:
    """FLOPs of one call; tensors in args/outputs are meta tensors. outputs: per output
    position (None where the call makes none, as a convolution backward's masked-off
    gradients: FLOP rules index results by position)."""
    more = _MORE_FLOP_RULES.get(op)
    if more is not None:
        return int(more(_shapes(args)))
    overload = _overload(op)
    rule = flop_registry.get(overload.overloadpacket) if overload is not None else None
    if rule is not None:
        out = outputs[0] if len(outputs) == 1 else tuple(outputs)
        try:
            return int(rule(*args, **kwargs, out_val=out))
        except (TypeError, ValueError, IndexError, RuntimeError):
            pass  # fall through to the element count
    info = lookup(op)
    if info is None or info.kind in (OpKind.VIEW, OpKind.FACTORY, OpKind.DATA_MOVEMENT, OpKind.SWAP):
        return 0
    if info.kind is OpKind.REDUCTION:
        return sum(int(a.numel()) for a in args if isinstance(a, torch.Tensor))
    return sum(int(o.numel()) for o in outputs if o is not None)


def bytes_moved(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> int:
    """Bytes read plus bytes written, assuming each tensor is touched once."""
    return sum(t.numel() * t.element_size() for t in (*inputs, *outputs))


# Training-mode batch norm takes statistics over the batch and spatial dims, far more than a
# cache holds: its kernels read their full-size inputs in a statistics pass before the pass
# that writes (CPU: batch_norm_cpu_collect_stats then the transform; CUDA:
# batch_norm_collect_statistics then batch_norm_transform_input, and batch_norm_backward_reduce
# then batch_norm_backward_elemt). op -> (the arguments read twice, the training flag's index).
_STATISTICS_PASS: dict[str, tuple[tuple[int, ...], int]] = {
    "aten.native_batch_norm.default": ((0,), 5),
    "aten._native_batch_norm_legit.default": ((0,), 5),
    "aten._native_batch_norm_legit_functional.default": ((0,), 5),
    "aten.native_batch_norm_backward.default": ((0, 1), 7),
}


def reread_bytes(op: str, args: Sequence[Any]) -> int:
    """Bytes a call reads again beyond bytes_moved's one touch per tensor: a training-mode batch
    norm's statistics pass over its full-size inputs (module constant _STATISTICS_PASS); a
    sparse matrix's product, a row of its dense operand per stored element (ir.sparse_ops);
    an index_select with more indices than its source has slices, each slice read once per
    index."""
    if op == SPMM_OP:
        return spmm_gathered_bytes(args)
    if op == INDEX_SELECT:
        return _gathered(args)[0]
    spec = _STATISTICS_PASS.get(op)
    if spec is None or len(args) <= spec[1] or args[spec[1]] is not True:
        return 0
    return sum(args[i].numel() * args[i].element_size() for i in spec[0] if isinstance(args[i], torch.Tensor))


# Ops that overwrite their first argument without reading it: bytes_moved counts it as read
# (an input) and written (the output); the kernel only writes it.
_OVERWRITES_FIRST = frozenset({"aten.copy_.default", "aten.zero_.default", "aten.fill_.Scalar",
                               "aten.fill_.Tensor"})
# Ops that take only their first argument's dtype and device, never its values.
_READS_ONLY_METADATA = frozenset({"aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default",
                                  "aten.new_full.default", "aten.new_empty_strided.default"})


CONV = "aten.convolution.default"                       # the op names the convolution rules share
INDEX_ADD_ = "aten.index_add_.default"
INDEX_SELECT = "aten.index_select.default"


def _gathered(args: Sequence[Any]) -> tuple[int, int]:
    """(bytes read again, bytes not read) of index_select(source, dim, index) against
    bytes_moved's one read of the source: the kernel reads one slice per index."""
    if len(args) < 3:
        return 0, 0
    source, dim, index = args[0], args[1], args[2]
    if not isinstance(source, torch.Tensor) or not isinstance(index, torch.Tensor) or source.dim() == 0:
        return 0, 0
    length = int(source.shape[dim])
    row = source.numel() // max(length, 1) * source.element_size()
    return max(0, index.numel() - length) * row, max(0, length - index.numel()) * row
CONV_BACKWARD = "aten.convolution_backward.default"


def conv_backward_mask(args: Sequence[Any]) -> tuple[bool, bool, bool] | None:
    """The output mask (grad_input, grad_weight, grad_bias) of a convolution_backward call's
    arguments, or None where it has no mask of three."""
    mask = args[10] if len(args) > 10 else None
    if not isinstance(mask, (list, tuple)) or len(mask) != 3:
        return None
    return bool(mask[0]), bool(mask[1]), bool(mask[2])


def index_add_untouched(args: Sequence[Any], named_rows: int | None = None) -> int:
    """Bytes of an in-place index_add_'s destination that bytes_moved counts as read and
    written and the kernel does not touch: the slices its index cannot name (at most one per
    index, and at most `named_rows` where the data says so: ir.tags.NamedRowsTag)."""
    if len(args) < 3:
        return 0
    dest, dim, index = args[0], args[1], args[2]
    if not isinstance(dest, torch.Tensor) or not isinstance(index, torch.Tensor) or dest.dim() == 0:
        return 0
    length = int(dest.shape[dim])
    named = index.numel() if named_rows is None else min(index.numel(), named_rows)
    untouched = max(0, length - named)
    return 2 * untouched * (dest.numel() // max(length, 1)) * dest.element_size()


def unread_bytes(op: str, args: Sequence[Any]) -> int:
    """Bytes bytes_moved counts as read that the call does not read: the destination of an
    overwriting in-place op (module constant _OVERWRITES_FIRST), which it only writes; the
    tensor a new_zeros-like op takes its dtype from (_READS_ONLY_METADATA); a
    convolution backward's input when it makes no weight or bias gradient, and its weight
    when it makes no input gradient (only their shapes are used); the slices of an in-place
    index_add_'s destination its index does not name (it reads and writes at most one slice
    per index: a part of a sum over edges touches its part's rows, not the whole sum), and the
    slices of an index_select's source it does not gather."""
    if op == INDEX_SELECT:
        return _gathered(args)[1]
    if op == INDEX_ADD_:
        return index_add_untouched(args)
    if op == CONV_BACKWARD:
        mask = conv_backward_mask(args)
        if mask is None:
            return 0
        unread = [] if mask[1] or mask[2] else [args[1]]
        unread += [] if mask[0] else [args[2]]
        return sum(t.numel() * t.element_size() for t in unread if isinstance(t, torch.Tensor))
    if op not in _OVERWRITES_FIRST | _READS_ONLY_METADATA or not args or not isinstance(args[0], torch.Tensor):
        return 0
    return args[0].numel() * args[0].element_size()


@cache
def _overload(op: str) -> torch._ops.OpOverload | None:

    try:
        return resolve_op(op)
    except ValueError:
        return None


@cache
def out_variant(op: str) -> str | None:
    """The overload of `op` that writes its one result into a given `out=` tensor, with the same
    other arguments ('aten.div.Tensor' -> 'aten.div.out', 'aten.lerp.Scalar' ->
    'aten.lerp.Scalar_out'), or None when PyTorch has none (or `op` is unknown)."""
    parts = op.split(".")
    if len(parts) != 3:
        return None
    ns, name, overload = parts
    try:
        own = resolve_op(op)._schema
        packet = getattr(getattr(torch.ops, ns), name)
        overloads = packet.overloads()
    except (AttributeError, RuntimeError, ValueError):
        return None
    ins = [a.name for a in own.arguments]
    for candidate in (f"{overload}_out", "out"):
        if candidate not in overloads:
            continue
        schema = getattr(packet, candidate)._schema
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if written == ["out"] and [a.name for a in schema.arguments if a.name != "out"] == ins:
            return f"{ns}.{name}.{candidate}"
    return None
