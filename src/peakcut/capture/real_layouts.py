"""Kernels whose fake kernel keeps a strided input's layout where the real kernel returns a
contiguous result: traced with the copies the real kernel makes.

Capture traces over FakeTensors, and make_fx decides there, from the fake strides, whether
a reshape is a view or a copy. A few fake kernels disagree with the real one on output
strides. Found by bench.fuzz: ``native_layer_norm_backward`` of an input that is not
contiguous (a LayerNorm after a transpose: the fuzz block "mix tokens") returns, real,
a contiguous input gradient (the CPU and CUDA kernels make grad_out and input contiguous
first); the fake kernel returns it in the input's transposed layout. The reshape of that
gradient in the linear layer's backward was traced as a view, which the real, contiguous
gradient cannot take: the captured program failed with "view size is not compatible
with input tensor's size and stride". ``_log_softmax_backward_data`` and batch norm
(forward and backward, on a transposed input) disagree the same way.

Two remedies, per op. Where the real kernel copies its inputs to contiguous ones first
(layer norm backward, log-softmax backward), the op is traced on inputs made contiguous in
the graph: the copy the kernel makes anyway, now visible to the memory model and the rules,
and the fake kernel sees what the real one computes on. Where the real kernel computes on
the strided input as it is (batch norm, forward and backward: a copy would change the
rounding of its statistics), the op is traced as it is and its result copied into the
format the real kernel writes (contiguous for a transposed input, channels-last for a
channels-last one). Calls whose inputs or results are in that format already are traced
as they are. tests/capture/test_real_layouts.py compares traced and real strides on
transposed and channels-last inputs for these ops and for those that need nothing
(softmax, GELU, pooling and convolution backward, layer norm forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._prims_common import suggest_memory_format
from torch.fx.experimental.proxy_tensor import decompose

aten = torch.ops.aten


def _made_contiguous(op: torch._ops.OpOverload, positions: Sequence[int]) -> Callable[..., Any]:
    """A make_fx decomposition: `op` on its `positions` arguments made contiguous, or
    NotImplemented (trace the call as it is) when they are."""
    def call(*args: Any, **kwargs: Any) -> Any:
        strided = [i for i in positions if isinstance(args[i], torch.Tensor) and not args[i].is_contiguous()]
        if not strided:
            return NotImplemented
        fixed = list(args)
        for i in strided:
            fixed[i] = fixed[i].contiguous()
        return op(*fixed, **kwargs)
    return call


def _result_in_input_format(op: torch._ops.OpOverload, source: int) -> Callable[..., Any]:
    """A make_fx decomposition: `op` as it is, then its first result copied into the memory
    format PyTorch suggests for argument `source` (contiguous, or channels-last), where the
    fake result is in neither: the real kernel writes that format, the fake one keeps the
    input's strides. The copy is exact; at run time it copies a result already in that
    format (a cost the memory model sees)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        with decompose({}):                     # the op itself, traced as it is
            out = op(*args, **kwargs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        fmt = suggest_memory_format(args[source])
        mask = output_mask(op, args, kwargs)
        if mask is not None and not mask[0]:    # not computed: the real kernel returns None (fake: a tensor)
            return out
        if first is None or first.is_contiguous(memory_format=fmt):
            return out
        first = first.contiguous(memory_format=fmt)
        return (first, *out[1:]) if isinstance(out, (tuple, list)) else first
    return call


def output_mask(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[bool] | None:
    """The call's output_mask argument (which results a backward kernel computes), if `op`
    has one. native_batch_norm_backward's fake kernel returns a tensor for a result the mask
    leaves out, where the real kernel returns None (capture.convert records None there)."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "output_mask":
            value = kwargs.get("output_mask", args[i] if i < len(args) else None)
            return list(value) if isinstance(value, (list, tuple)) else None
    return None


# op -> the argument positions its real kernel makes contiguous (and computes on: the
# kernel copies them first, so copying them in the graph changes no number)
CONTIGUOUS_INPUTS: dict[torch._ops.OpOverload, tuple[int, ...]] = {
    aten.native_layer_norm_backward.default: (0, 1),        # grad_out, input
    aten._log_softmax_backward_data.default: (0, 1),         # grad_output, output
}

# op -> the argument whose suggested memory format the real kernel writes its first result
# in; its kernel computes on strided inputs as they are (copying them first changes the
# batch statistics' rounding), so the result is copied instead
RESULT_IN_INPUT_FORMAT: dict[torch._ops.OpOverload, int] = {
    aten.native_batch_norm.default: 0,
    aten._native_batch_norm_legit.default: 0,
    aten._native_batch_norm_legit.no_stats: 0,
    aten.native_batch_norm_backward.default: 1,              # grad_input in the input's format
}


def real_layout_table() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """The decomposition table capture traces with (peakcut.capture.trace)."""
    table = {op: _made_contiguous(op, positions) for op, positions in CONTIGUOUS_INPUTS.items()}
    table.update({op: _result_in_input_format(op, source) for op, source in RESULT_IN_INPUT_FORMAT.items()})
    return table
