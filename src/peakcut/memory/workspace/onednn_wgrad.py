"""oneDNN convolution backward-weights on CPU: its allocation sequence and scratchpads.

The scratchpad depends on how oneDNN's thread balancers split the minibatch (each
minibatch thread beyond the first keeps its own weight-gradient copy) and on its
`cpu_reducer_t` reducers; both are reproduced here.
"""

from __future__ import annotations

from peakcut.memory.workspace.call import cdiv, prod, round_up
from peakcut.memory.workspace.conv_geometry import ConvGeometry, first_conv, fwd_kind, pad16
from peakcut.memory.workspace.machine import CpuMachine
from peakcut.memory.workspace.onednn import gemm_col, padded_bias


def _gemm_wgrad_scratch(g: ConvGeometry, machine: CpuMachine) -> int:
    """fp32 gemm backward-weights scratchpad: im2col per thread plus a weight-reduction buffer of
    ``4 * nthr * weight bytes`` (oneDNN multiplies a byte size by ``sizeof(float)``), where ``nthr``
    is all threads when ``out_spatial / nthreads < 256`` (and batch > 1 or groups > 2), else 1
    (measured exact for 1x1 padded and 32-group convs)."""
    os_ = prod(g.outs[-2:])
    outer = os_ // max(machine.threads, 1) < 256 and (g.n != 1 or g.groups > 2)
    nthr = machine.threads if outer else 1
    im2col = 0 if g.k == 1 and not g.strided and all(p == 0 for p in g.padding) else g.ic_g * g.k * g.out_sp
    col = nthr * im2col * 4 + machine.fit.entry_pad if im2col else 0
    return col + 4 * nthr * g.weight_bytes() + machine.fit.entry_pad

def _wgrad_balance(g: ConvGeometry, machine: CpuMachine, block: int, two_d: bool) -> int:
    """nthr_mb of oneDNN jit_avx512_common_conv_bwd_weights_kernel_f32::balance (direct kernels).

    Threads split minibatch (x output rows for the 2-D harness), groups, oc and ic blocks to
    minimise a memory-traffic cost, then a compute-cost pass; every minibatch thread beyond the first
    needs its own weight-gradient copy.
    """
    if machine.threads < g.groups or machine.threads <= 1:
        return 1
    nthr = machine.threads // g.groups
    first = first_conv(g) and g.ic in (1, 2, 3)
    ic_block = g.ic if first else block
    nb_ic = cdiv(g.ic_g if first else round_up(g.ic_g, block), ic_block)
    nb_oc = cdiv(round_up(g.oc_g, block), block)
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
        return (cdiv(g.n * ih_r, m) * groups_per_thr * cdiv(nb_ic, i) * ic_block * ih_n * iw * id_
                // sd // sh // sw
                + cdiv(g.n * oh_r, m) * groups_per_thr * cdiv(nb_oc, o) * block * oh_n * ow * od
                + 8 * groups_per_thr * cdiv(nb_oc, o) * cdiv(nb_ic, i) * kh * kw * kd * ic_block * block)

    def comp(m: int, o: int, i: int) -> int:
        return cdiv(g.n * oh_r, m) * groups_per_thr * cdiv(nb_oc, o) * cdiv(nb_ic, i)

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
    if machine.threads / 2 < nthr_mb < machine.threads:
        nthr_mb = min(g.n * od * nthr_oh_reduce, machine.threads)
    return nthr_mb


def _wgrad_balance_1x1(g: ConvGeometry, machine: CpuMachine) -> int:
    """nthr_mb of oneDNN's 1x1 backward-weights balance (reduction over the whole output plane)."""
    if machine.threads < g.groups or machine.threads <= 1:
        return 1
    nthr = machine.threads // g.groups
    nb_ic, nb_oc = cdiv(g.ic_g, 16), cdiv(g.oc_g, 16)
    rb = g.out_sp

    def mem(m: int, o: int, i: int) -> int:
        return (cdiv(g.n, m) * cdiv(nb_ic, i) * 16 * rb + cdiv(g.n, m) * cdiv(nb_oc, o) * 16 * rb
                + 12 * cdiv(nb_oc, o) * cdiv(nb_ic, i) * 256)

    best, best_mem = (1, 1, 1), mem(1, 1, 1)
    for m in range(1, min(nthr, g.n) + 1):
        for o in range(1, min(nthr // m, nb_oc) + 1):
            cand = (m, o, min(nthr // m // o, nb_ic))
            if mem(*cand) <= best_mem:
                best, best_mem = cand, mem(*cand)
    nthr_mb = best[0]
    if machine.threads / 2 < nthr_mb < machine.threads:
        nthr_mb = min(g.n, machine.threads)
    return nthr_mb


def wgrad_events(g: ConvGeometry, machine: CpuMachine, bias_channels: int, channels_last: bool) -> list[int]:
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
    kind = fwd_kind(g)
    if kind == "gemm":
        col = _gemm_wgrad_scratch(g, machine) if g.isz == 4 else gemm_col(g, machine)
        return [gw, col, gb_b, -col, gb, gw, -gw, -gb_b]
    block = 16
    if first_conv(g) and g.ic not in (1, 2, 3) and g.isz == 4 and not channels_last:
        block = 8  # oneDNN falls back to the AVX2 kernel with 8-channel blocks
    first_plain = first_conv(g) and (g.ic in (1, 2, 3) or channels_last)
    if kind == "dw":
        gw_b = pad16(g.groups) * g.k * 4
    elif first_plain:
        gw_b = pad16(g.oc) * g.ic * g.k * 4
    else:
        gw_b = g.groups * round_up(g.oc_g, block) * round_up(g.ic_g, block) * g.k * 4
    if g.isz == 2:
        gw_b //= 2
    gy_r = x_r = 0
    if not channels_last:
        gy_r = g.act(round_up(g.oc, block), g.out_sp)
        x_r = 0 if first_plain else g.act(round_up(g.ic, block), g.in_sp)
    scratch = 0 if kind == "dw" else _wgrad_scratch(g, machine, gw_b, block, with_bias, channels_last)
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
    ub = cdiv(njobs, ngroups)
    complexity = njobs * job * reduction
    for c_njobs in range(min_njobs, njobs):
        c_ngroups = min(njobs // c_njobs, nthr)
        c_per_group = min(nthr // c_ngroups, reduction)
        c_ub = cdiv(njobs, c_ngroups)
        if c_per_group > 1 and c_ub > max_njobs:
            continue
        c_complexity = job * c_ub * (cdiv(reduction, c_per_group) + (c_per_group != 1))
        if c_complexity < complexity:
            ngroups, per_group, ub, complexity = c_ngroups, c_per_group, c_ub, c_complexity
    if per_group == 1:
        return 0
    return ngroups * (per_group - 1) * ub * job * 4 + 8192 + 4096 * ngroups


def _bias_reducer(g: ConvGeometry, machine: CpuMachine) -> int:
    """1x1 backward-weights bias reducer: jobs of 16 channels, reduced over the minibatch."""
    return _reducer(machine.threads, 16, g.groups * cdiv(g.oc_g, 16), g.n, machine.threads * 3 * 5 * 5 * 16 * 16)


def _avx2_wgrad_scratch(g: ConvGeometry, machine: CpuMachine, with_bias: bool) -> int:
    """AVX2 backward-weights kernel (8-channel blocks, oneDNN's fallback for the first conv with
    4 <= ic < 16): a weight reducer (jobs of one 8o8i kernel block, reduced over minibatch x depth)
    and a bias reducer (jobs of 8 channels, over the minibatch), both ``cpu_reducer_t``."""
    od = g.outs[0] if len(g.outs) == 3 else 1
    njobs_w = g.groups * cdiv(g.ic_g, 8) * cdiv(g.oc_g, 8)
    wei = _reducer(machine.threads, g.k * 64, njobs_w, g.n * od, 1 << 21)
    bias = _reducer(machine.threads, 8, g.groups * cdiv(g.oc_g, 8), g.n, 1 << 21) if with_bias else 0
    return wei + bias


def _wgrad_scratch(g: ConvGeometry, machine: CpuMachine, gw_b: int, block: int, with_bias: bool, channels_last: bool) -> int:
    """oneDNN backward-weights scratchpad (``gw_b``: bytes of the blocked weight gradient).

    fp32: ``(nthr_mb - 1)`` weight(+bias) reduction copies + 8320 bytes when the balancer splits
    the minibatch (exact), a padded bias when oc is not a multiple of the block, and for strided 1x1
    kernels a per-thread reduced-stride input.  1x1 kernels with bias also book the padded bias and
    the bias reducer (``_bias_reducer``).  bf16 (approximate): fp32 accumulators and per-thread
    transposed copies of one image of input and grad_output.
    """
    one_by_one = fwd_kind(g) == "1x1"
    bias_1x1 = padded_bias(g.oc, 4, machine) + _bias_reducer(g, machine) if one_by_one and with_bias else 0
    if g.isz == 2 and one_by_one:
        strided = machine.threads * pad16(g.oc) * g.out_sp * 4 if g.strided else 0
        return machine.threads * gw_b * 2 + machine.fit.bf16_wgrad_1x1_overhead + strided + bias_1x1
    if g.isz == 2:
        nthr_mb = _wgrad_balance(g, machine, block, two_d=not channels_last)
        transposed = 2 * (pad16(g.ic) * g.in_sp + pad16(g.oc) * g.out_sp)
        return nthr_mb * (gw_b * 2 + transposed + machine.fit.bf16_wgrad_per_thread)
    bias_copy = round_up(g.oc, block) * 4 + machine.fit.entry_pad if with_bias and g.oc % block else 0
    if block == 8:
        return _avx2_wgrad_scratch(g, machine, with_bias) + bias_copy
    if one_by_one:
        nthr_mb = _wgrad_balance_1x1(g, machine)
        reduction = (nthr_mb - 1) * gw_b + machine.fit.wgrad_reduction_overhead if nthr_mb > 1 else 0
        rtus = machine.threads * pad16(g.ic) * g.out_sp * 4 + machine.fit.entry_pad if g.strided else 0
        return reduction + rtus + bias_1x1
    nthr_mb = _wgrad_balance(g, machine, block, two_d=not channels_last)
    bias_pad = g.groups * round_up(g.oc_g, block) * 4
    reduction = (nthr_mb - 1) * (gw_b + bias_pad) + machine.fit.wgrad_reduction_overhead if nthr_mb > 1 else 0
    return reduction + bias_copy
