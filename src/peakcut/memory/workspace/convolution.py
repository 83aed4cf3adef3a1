"""Convolution and its backward on CPU: oneDNN's reorders and scratchpads, or THNN's im2col.

The oneDNN events (peakcut.memory.workspace.onednn, .onednn_wgrad) are exact where oneDNN's
booking was identified and approximate otherwise (docs/workspace.md).
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

from peakcut.memory.workspace.call import OpCall, Rule, alloc_peak, nbytes, prod
from peakcut.memory.workspace.conv_geometry import (
    cl_format,
    conv_backend,
    conv_geometry,
    conv_out_spatial,
    input_copies,
    slow_format,
    slow_path_columns,
    transposed_as_conv,
    use_channels_last,
)
from peakcut.memory.workspace.onednn import bwd_data_events, conv_fwd_cl_events, conv_fwd_events
from peakcut.memory.workspace.onednn_wgrad import wgrad_events


def convolution(c: OpCall) -> int:
    """convolution.default.

    mkldnn (oneDNN) path -- fp32 unless a 1x1 unstrided conv with batch < 16 runs single-threaded
    or batch 1 with small kernels; bf16 always (AVX-512): see ``conv_fwd_events`` (plain tensors),
    ``conv_fwd_cl_events`` (channels-last) and, for transposed convs (oneDNN runs backward-data),
    ``bwd_data_events``.  THNN paths: the im2col ``columns`` buffer.  Non-contiguous inputs are
    copied first (to channels-last when the input or weight is channels-last).
    """
    x, w = c.tensor("input"), c.tensor("weight")
    if x is None or w is None:
        return 0
    a = c.args
    out_sp = conv_out_spatial(x, w, a)
    backend = conv_backend(x, w, a, c.machine)
    transposed = bool(a.get("transposed"))
    out_channels = w.shape[1] * int(a["groups"]) if transposed else w.shape[0]
    out_bytes = x.shape[0] * out_channels * prod(out_sp) * x.element_size()
    if backend == "empty":
        return 0
    if backend != "mkldnn":
        copies = input_copies((x, w), slow_format(x, w, backend))
        cols = slow_path_columns(x, w, a, out_sp, backend, transposed)
        group_tmp = out_bytes if int(a["groups"]) > 1 else 0
        return copies + cols + group_tmp
    channels_last = use_channels_last(x, w) and not transposed
    fmt = cl_format(x) if channels_last else torch.contiguous_format
    copies = input_copies((x, w), fmt)
    if transposed:
        g = transposed_as_conv(x, w, a, out_sp)
        events = bwd_data_events(g, c.machine, channels_last=False)
    elif channels_last:
        events = conv_fwd_cl_events(conv_geometry(x, w, a, out_sp), c.machine)
    else:
        bias = c.tensor("bias")
        bias_isz = 0 if bias is None else bias.element_size()
        events = conv_fwd_events(conv_geometry(x, w, a, out_sp), c.machine, bias_isz)
    return copies + max(alloc_peak(events) - out_bytes, 0)


def convolution_backward(c: OpCall) -> int:
    """convolution_backward.default.

    oneDNN: backward-data (if grad_input requested, ``bwd_data_events``) then backward-weights
    (if grad_weight or grad_bias requested, ``wgrad_events``, which always produces grad_weight).
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
    backend = conv_backend(x, w, a, c.machine)
    if backend == "empty":
        return 0
    out_sp = tuple(gy.shape[2:])
    bias_channels = gy.shape[1]
    requested = (nbytes(x) if mask[0] else 0) + (nbytes(w) if mask[1] else 0)
    requested += bias_channels * gy.element_size() if mask[2] else 0
    if backend != "mkldnn":
        copies = input_copies((gy, x, w), slow_format(x, w, backend))
        cols = slow_path_columns(x, w, a, out_sp, backend, transposed)
        return copies + (cols if (mask[0] or mask[1]) else 0)
    channels_last = use_channels_last(x, w) and not transposed
    fmt = cl_format(x) if channels_last else torch.contiguous_format
    copies = input_copies((gy, x, w), fmt)
    events: list[int] = []
    if transposed:
        # grad_input of a transposed conv is the forward conv it is the gradient of (input =
        # grad_output); its weight gradient is that conv's, with the bias over grad_output channels.
        g = transposed_as_conv(x, w, a, out_sp)
        if mask[0]:
            events += conv_fwd_events(g, c.machine)
        if mask[1] or mask[2]:
            events += wgrad_events(g, c.machine, g.ic if with_bias else 0, channels_last=False)
    else:
        g = conv_geometry(x, w, a, out_sp)
        if mask[0]:
            events += bwd_data_events(g, c.machine, channels_last)
        if mask[1] or mask[2]:
            events += wgrad_events(g, c.machine, g.oc if with_bias else 0, channels_last)
    return copies + max(alloc_peak(events) - requested, 0)


RULES: Mapping[str, Rule] = types.MappingProxyType({
    "convolution": convolution,
    "convolution_backward": convolution_backward,
})
