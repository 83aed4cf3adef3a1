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
with input tensor's size and stride". ``_log_softmax_backward_data`` disagrees the same way.

Each op here is traced with the inputs the real kernel makes contiguous made contiguous
in the graph (a copy the kernel makes anyway, now visible to the memory model and the
rules), so the fake kernel sees what the real one computes on and agrees on the layout.
Calls whose inputs are contiguous already are traced as they are. Ops whose fake and real
layouts agree (checked on transposed and channels-last inputs, tests/capture/
test_real_layouts.py: softmax, GELU, pooling, upsampling and convolution backward, layer
and group norm forward) are not listed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

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


# op -> the argument positions its real kernel makes contiguous
CONTIGUOUS_INPUTS: dict[torch._ops.OpOverload, tuple[int, ...]] = {
    aten.native_layer_norm_backward.default: (0, 1),        # grad_out, input
    aten._log_softmax_backward_data.default: (0, 1),         # grad_output, output
}


def real_layout_table() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """The decomposition table capture traces with (peakcut.capture.trace)."""
    return {op: _made_contiguous(op, positions) for op, positions in CONTIGUOUS_INPUTS.items()}
