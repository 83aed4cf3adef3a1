"""oneDNN convolution forward and backward-data on CPU: the allocation sequence of each call.

Each `*_events` function returns the signed allocation sizes (reorders to blocked layouts,
scratchpads, the dense result) in the order oneDNN makes them; the rule's transient is the
peak of their running sum minus the outputs. Byte counts fitted per machine come from the
machine's OneDnnFit.
"""

from __future__ import annotations

from peakcut.memory.workspace.call import round_up
from peakcut.memory.workspace.conv_geometry import (
    ConvGeometry,
    blocked_weight,
    fwd_kind,
    pad16,
)
from peakcut.memory.workspace.machine import CpuMachine


def gemm_col(g: ConvGeometry, machine: CpuMachine) -> int:
    """gemm convolution im2col buffer: ``nthreads * ic_g * k * out_spatial * 4 + 128`` (none for
    1x1 / stride 1 / no padding)."""
    if g.k == 1 and not g.strided and all(p == 0 for p in g.padding):
        return 0
    return machine.threads * g.ic_g * g.k * g.out_sp * 4 + machine.fit.entry_pad


def padded_bias(oc: int, bias_isz: int, machine: CpuMachine) -> int:
    """oneDNN ``key_conv_padded_bias``: a bias whose channels are not a multiple of 16 is copied
    into a 16-padded buffer (``bias_isz``: bytes per bias element; 0 without bias)."""
    return pad16(oc) * bias_isz + machine.fit.entry_pad if bias_isz and oc % 16 else 0


def conv_fwd_events(g: ConvGeometry, machine: CpuMachine, bias_isz: int = 0) -> list[int]:
    """Allocation sequence of oneDNN convolution forward on plain tensors (incl. the dense output).

    Measured: ``[scratch, src reorder, weight reorder, blocked dst, -w, -src, -scratch, output,
    -blocked dst]``.  Blocked layouts pad channels to 16; the first conv (ic < 16, kernel > 1x1)
    reads the plain src; depthwise pads groups to 16; the gemm kernel (also any 1x1 kernel with
    padding) uses plain layouts plus im2col.  The scratchpad holds a 16-padded copy of the bias when
    ``oc % 16`` (``padded_bias``; ``bias_isz``: bias element size, 0 without bias).
    """
    kind = fwd_kind(g)
    out = g.act(g.oc, g.out_sp)
    if kind == "gemm":
        scratch = gemm_col(g, machine)
        return [scratch, out, -scratch, out, -out]
    dst = g.act(pad16(g.oc), g.out_sp)
    bias_pad = padded_bias(g.oc, bias_isz, machine)
    if kind == "first":
        ic = g.ic if g.isz == 4 else round_up(g.ic, 2)
        w_r = pad16(g.oc) * ic * g.k * g.isz
        return [bias_pad, w_r, dst, -w_r, -bias_pad, out, -dst]
    src = g.act(pad16(g.ic), g.in_sp)
    w_r = pad16(g.groups) * g.k * g.isz if kind == "dw" else blocked_weight(g)
    scratch = bias_pad
    if kind == "1x1" and g.isz == 2:
        scratch += machine.threads * pad16(g.oc) * g.out_sp * 4 + machine.fit.entry_pad
    if kind == "1x1" and g.strided:
        scratch += machine.threads * pad16(g.ic) * g.out_sp * g.isz + machine.fit.entry_pad
    return [scratch, src, w_r, dst, -w_r, -src, -scratch, out, -dst]


def _cl_scratch(machine: CpuMachine) -> int:
    return machine.fit.cl_brgemm_scratch_base + machine.threads * machine.fit.cl_brgemm_scratch_per_thread


def _cl_oc_pad(c: int) -> int:
    return round_up(c, 16 if c <= 16 else 32)


def conv_fwd_cl_events(g: ConvGeometry, machine: CpuMachine) -> list[int]:
    """Channels-last forward (brgemm, NHWC in place): output, scratch and a reordered weight with
    output channels padded to 16/32 (measured)."""
    out = g.act(g.oc, g.out_sp)
    w_r = g.groups * _cl_oc_pad(g.oc_g) * g.ic_g * g.k * g.isz
    scratch = _cl_scratch(machine)
    return [out, scratch, w_r, -w_r, -scratch]


def _brg_strided_scratch(g: ConvGeometry, machine: CpuMachine) -> int:
    """brgconv_strided backward-data scratchpad: ``base + nthreads * (isz * oc * out_spatial +
    20504)`` -- per thread about one image of grad_output (independent of batch and input
    channels); within ~20 % on the measured shapes (approximate)."""
    per_thread = g.isz * g.oc * g.out_sp + machine.fit.brg_strided_per_thread
    return (machine.fit.brg_strided_base_bf16 if g.isz == 2 else machine.fit.brg_strided_base_f32) + machine.threads * per_thread


def _ic_block_strided(ic: int) -> int:
    return round_up(ic, 64 if ic >= 64 else 16)


def bwd_data_events(g: ConvGeometry, machine: CpuMachine, channels_last: bool) -> list[int]:
    """Allocation sequence of oneDNN backward-data producing the dense grad_input (incl. it).

    Measured: stride 1 (and depthwise): blocked grad_out / weight / grad_input like the forward.
    Stride > 1 (brgconv_strided): NHWC grad_out and grad_input, weight with input channels padded
    to 16/64, and the NHWC result made contiguous through a temporary (three grad_input-sized
    buffers at the end).  Channels-last tensors are used in place.
    """
    gx = g.act(g.ic, g.in_sp)
    kind = fwd_kind(g)
    if kind == "gemm":
        scratch = gemm_col(g, machine)
        return [gx, scratch, -scratch, gx, -gx] if not channels_last else [gx, scratch, -scratch]
    if g.strided and kind != "dw":
        oc = g.oc_g if g.isz == 4 else round_up(g.oc_g, 2)
        w_r = g.groups * oc * _ic_block_strided(g.ic_g) * g.k * g.isz
        scratch = _brg_strided_scratch(g, machine)
        if channels_last:
            return [gx, w_r, scratch, -scratch, -w_r]
        gy = g.act(g.oc, g.out_sp)
        return [gy, w_r, gx, scratch, -scratch, -w_r, -gy, gx, gx, -gx, -gx]
    if channels_last:
        w_r = g.groups * g.oc_g * _cl_oc_pad(g.ic_g) * g.k * g.isz
        scratch = _cl_scratch(machine) + machine.fit.entry_pad
        return [gx, w_r, scratch, -scratch, -w_r]
    gy = g.act(pad16(g.oc), g.out_sp)
    gx_b = g.act(pad16(g.ic), g.in_sp)
    w_r = pad16(g.groups) * g.k * g.isz if kind == "dw" else blocked_weight(g)
    scratch = 0
    if kind == "1x1" and g.isz == 2:
        scratch = machine.threads * pad16(g.ic) * g.in_sp * 4 + machine.fit.entry_pad
    return [gy, w_r, gx_b, scratch, -scratch, -w_r, -gy, gx, -gx_b]
