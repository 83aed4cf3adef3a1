"""CPU workspace model vs the real allocator (torch.profiler memory events) for single op calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from peakcut.memory.workspace import CpuMachine, cpu_workspace_bytes, workspace_ops
from peakcut.runtime.measure import allocator_events, profiler_peak

aten = torch.ops.aten
R = torch.randn
CL = torch.channels_last

ONEDNN_AVX512 = torch.backends.mkldnn.is_available() and torch.backends.cpu.get_cpu_capability().startswith("AVX512")
onednn = pytest.mark.skipif(not ONEDNN_AVX512, reason="oneDNN layouts were calibrated on AVX-512")


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return torch.device("meta") if isinstance(x, torch.device) else x


def _alloc_events(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[list[int], Any]:
    """Signed sizes of the CPU allocator events during one call (in time order) and its result."""
    return allocator_events(lambda: op(*args, **kwargs))


def _new_output_bytes(real: Any, meta: Any, args: tuple, kwargs: dict) -> int:
    """Bytes of new storages among outputs the meta kernel returns (aliases of inputs cost 0)."""
    inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    seen: set[int] = set()
    total = 0
    for r, m in zip(tree_flatten(real)[0], tree_flatten(meta)[0], strict=False):
        if isinstance(r, torch.Tensor) and isinstance(m, torch.Tensor):
            ptr = r.untyped_storage().data_ptr()
            if ptr not in inputs and ptr not in seen:
                seen.add(ptr)
                total += r.untyped_storage().nbytes()
    return total


def measure(op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> tuple[int, int]:
    """(measured transient, modelled transient) of one call."""
    kwargs = kwargs or {}
    margs, mkwargs = tree_map(_meta, args), tree_map(_meta, kwargs)
    mout = op(*margs, **mkwargs)
    model = cpu_workspace_bytes(op, margs, mkwargs, [t for t in tree_flatten(mout)[0] if isinstance(t, torch.Tensor)])
    op(*args, **kwargs)  # warm-up
    peak, out = profiler_peak(lambda: op(*args, **kwargs))
    return peak - _new_output_bytes(out, mout, args, kwargs), model


def assert_close(measured: int, model: int) -> None:
    assert abs(model - measured) <= max(256, 0.02 * measured), f"measured {measured}, model {model}"


Make = Callable[[], tuple[tuple, dict]]

CASES: list[tuple[str, torch._ops.OpOverload, Make]] = [
    # TensorIterator: promotion casts and wrapped Python scalars
    ("add f32+f64", aten.add.Tensor, lambda: ((R(64, 128), R(64, 128, dtype=torch.float64)), {})),
    ("add int64 + 0-d f32", aten.add.Tensor, lambda: ((torch.ones(64, 128, dtype=torch.int64), torch.tensor(2.0)), {})),
    ("mul f32*bool", aten.mul.Tensor, lambda: ((R(64, 128), R(64, 128) > 0), {})),
    ("mul f32*0.5", aten.mul.Tensor, lambda: ((R(64, 128), 0.5), {})),
    ("mul bf16*0.5", aten.mul.Tensor, lambda: ((R(64, 128).bfloat16(), 0.5), {})),
    ("lt int64<0.5", aten.lt.Scalar, lambda: ((torch.ones(64, 128, dtype=torch.int64), 0.5), {})),
    ("ge int64>=0", aten.ge.Scalar, lambda: ((torch.ones(64, 128, dtype=torch.int64), 0), {})),
    ("where f32,f64", aten.where.self, lambda: ((R(64, 128) > 0, R(64, 128), R(64, 128, dtype=torch.float64)), {})),
    ("add_ bf16 += f32", aten.add_.Tensor, lambda: ((R(64, 128).bfloat16(), R(64, 128)), {})),
    ("div_.Scalar", aten.div_.Scalar, lambda: ((R(64, 128), 0.9), {})),
    ("exp int64", aten.exp.default, lambda: ((torch.ones(64, 128, dtype=torch.int64),), {})),
    ("clamp f32 (bounds not wrapped)", aten.clamp.default, lambda: ((R(64, 128), -1.0, 1.0), {})),
    ("gelu", aten.gelu.default, lambda: ((R(8, 64, 28, 28),), {})),
    # reductions
    ("sum bool -> int64", aten.sum.dim_IntList, lambda: ((R(64, 128) > 0, [1]), {})),
    ("sum f32 full (per-thread partials)", aten.sum.dim_IntList, lambda: ((R(8, 64, 28, 28), []), {})),
    ("sum bf16 [0,2,3] (fp32 copy)", aten.sum.dim_IntList, lambda: ((R(8, 64, 28, 28).bfloat16(), [0, 2, 3]), {})),
    ("sum bf16 [2,3] (no copy)", aten.sum.dim_IntList, lambda: ((R(8, 64, 28, 28).bfloat16(), [2, 3]), {})),
    ("mean f32", aten.mean.dim, lambda: ((R(8, 64, 28, 28), [2, 3], True), {})),
    ("mean bf16", aten.mean.dim, lambda: ((R(8, 64, 28, 28).bfloat16(), [-1]), {})),
    ("any f32", aten.any.dim, lambda: ((R(64, 128), 1), {})),
    # normalization, softmax, dropout, sort, indexing, upsampling
    ("batch_norm train", aten.native_batch_norm.default,
     lambda: ((R(8, 64, 28, 28), R(64), R(64), torch.zeros(64), torch.ones(64), True, 0.1, 1e-5), {})),
    ("batch_norm train channels-last", aten.native_batch_norm.default,
     lambda: ((R(8, 64, 28, 28).to(memory_format=CL), R(64), R(64), torch.zeros(64), torch.ones(64), True, 0.1, 1e-5), {})),
    ("group_norm channels-last", aten.native_group_norm.default,
     lambda: ((R(8, 64, 28, 28).to(memory_format=CL), R(64), R(64), 8, 64, 784, 32, 1e-5), {})),
    ("layer_norm non-contiguous", aten.native_layer_norm.default,
     lambda: ((R(128, 32, 256).transpose(0, 1), [256], R(256), R(256), 1e-5), {})),
    ("_softmax non-contiguous", aten._softmax.default, lambda: ((R(16, 8, 64, 64).transpose(1, 2), -1, False), {})),
    ("native_dropout", aten.native_dropout.default, lambda: ((R(8, 64, 28, 28), 0.1, True), {})),
    ("sort dim 0", aten.sort.default, lambda: ((R(4096, 64), 0), {})),
    ("index int32", aten.index.Tensor, lambda: ((R(1000, 64), [torch.randint(0, 1000, (4096,), dtype=torch.int32)]), {})),
    ("embedding expanded ids", aten.embedding.default, lambda: ((R(1000, 64), torch.randint(0, 1000, (1, 64)).expand(4, 64)), {})),
    ("upsample_nearest2d (channels-last kernel)", aten.upsample_nearest2d.default, lambda: ((R(4, 16, 28, 28), [56, 56]), {})),
    ("upsample_bilinear2d (generic kernel)", aten.upsample_bilinear2d.default, lambda: ((R(4, 16, 28, 28), [65, 65], False), {})),
    ("mm with a non-BLAS operand", aten.mm.default, lambda: ((R(256, 256)[:, ::2], R(128, 96)), {})),
    ("bmm", aten.bmm.default, lambda: ((R(8, 64, 32), R(8, 32, 64)), {})),
    ("max_pool2d_with_indices", aten.max_pool2d_with_indices.default, lambda: ((R(8, 64, 28, 28), [3, 3], [2, 2], [1, 1]), {})),
]


def _conv(x_shape: tuple, w_shape: tuple, stride: int, pad: int, groups: int = 1, cl: bool = False) -> Make:
    def make() -> tuple[tuple, dict]:
        x, w = R(*x_shape), R(*w_shape)
        if cl:
            x, w = x.to(memory_format=CL), w.to(memory_format=CL)
        return (x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups), {}
    return make


def _conv_bwd(x_shape: tuple, w_shape: tuple, stride: int, pad: int, mask: tuple[bool, bool, bool],
              groups: int = 1, cl: bool = False) -> Make:
    def make() -> tuple[tuple, dict]:
        (x, w, _, st, pd, dl, tr, op, g), _ = _conv(x_shape, w_shape, stride, pad, groups, cl)()
        gy = torch.randn_like(aten.convolution.default(x, w, None, st, pd, dl, tr, op, g))
        return (gy, x, w, [w.shape[0]], st, pd, dl, tr, op, g, list(mask)), {}
    return make


ALL = (True, True, True)
CONV_CASES: list[tuple[str, torch._ops.OpOverload, Make]] = [
    ("conv 3x3", aten.convolution.default, _conv((8, 64, 28, 28), (64, 64, 3, 3), 1, 1)),
    ("conv 3x3 padded channels", aten.convolution.default, _conv((8, 24, 28, 28), (40, 24, 3, 3), 1, 1)),
    ("conv 1x1 stride 2", aten.convolution.default, _conv((8, 64, 28, 28), (128, 64, 1, 1), 2, 0)),
    ("conv 7x7 stride 2 first layer", aten.convolution.default, _conv((8, 3, 56, 56), (64, 3, 7, 7), 2, 3)),
    ("conv depthwise", aten.convolution.default, _conv((8, 64, 28, 28), (64, 1, 3, 3), 1, 1, groups=64)),
    ("conv grouped (gemm)", aten.convolution.default, _conv((8, 64, 28, 28), (64, 2, 3, 3), 1, 1, groups=32)),
    ("conv channels-last", aten.convolution.default, _conv((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, cl=True)),
    ("conv_bwd 3x3 all", aten.convolution_backward.default, _conv_bwd((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, ALL)),
    ("conv_bwd 3x3 grad_input only", aten.convolution_backward.default,
     _conv_bwd((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, (True, False, False))),
    ("conv_bwd 3x3 grad_bias only", aten.convolution_backward.default,
     _conv_bwd((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, (False, False, True))),
    ("conv_bwd 1x1", aten.convolution_backward.default, _conv_bwd((8, 256, 14, 14), (64, 256, 1, 1), 1, 0, ALL)),
    ("conv_bwd first layer weight only", aten.convolution_backward.default,
     _conv_bwd((8, 3, 56, 56), (64, 3, 7, 7), 2, 3, (False, True, False))),
    ("conv_bwd padded channels", aten.convolution_backward.default, _conv_bwd((8, 64, 28, 28), (100, 64, 3, 3), 1, 1, ALL)),
    ("conv_bwd channels-last", aten.convolution_backward.default,
     _conv_bwd((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, ALL, cl=True)),
    # 1x1 with ic < 16 and oc < 16 (U-Net head): 1x1 kernel on blocked src, 16-padded bias copy,
    # bias reducer in the weight gradient
    ("conv 1x1 oc2 with bias", aten.convolution.default,
     lambda: ((R(2, 8, 32, 32), R(2, 8, 1, 1), R(2), [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {})),
    ("conv_bwd 1x1 oc2 with bias", aten.convolution_backward.default,
     lambda: ((R(2, 2, 32, 32), R(2, 8, 32, 32), R(2, 8, 1, 1), [2], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
               [True, True, True]), {})),
    ("conv 1x1 padded (gemm)", aten.convolution.default, _conv((2, 64, 16, 16), (64, 64, 1, 1), 1, 1)),
    ("conv_bwd 1x1 padded (gemm) weight only", aten.convolution_backward.default,
     _conv_bwd((2, 64, 16, 16), (64, 64, 1, 1), 1, 1, (False, True, False))),
    ("conv_bwd first conv ic8 weight+bias (avx2 reducers)", aten.convolution_backward.default,
     _conv_bwd((8, 8, 28, 28), (8, 8, 3, 3), 1, 1, (False, True, True))),
    ("convT_bwd 2x2 stride 2", aten.convolution_backward.default,
     lambda: ((R(2, 8, 32, 32), R(2, 16, 16, 16), R(16, 8, 2, 2), [8], [2, 2], [0, 0], [1, 1], True, [0, 0], 1,
               [True, True, True]), {})),
]


def _check_case(op: torch._ops.OpOverload, make: Make) -> None:
    torch.manual_seed(0)
    args, kwargs = make()
    assert_close(*measure(op, args, kwargs))


@pytest.mark.parametrize(("label", "op", "make"), CASES, ids=[c[0] for c in CASES])
def test_model_matches_allocator(label: str, op: torch._ops.OpOverload, make: Make) -> None:
    _check_case(op, make)


@onednn
@pytest.mark.parametrize(("label", "op", "make"), CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_convolution_matches_allocator(label: str, op: torch._ops.OpOverload, make: Make) -> None:
    _check_case(op, make)


@onednn
def test_bias_reducer_follows_threads() -> None:
    """1x1 weight gradient with bias, one 16-channel block: the bias reducer splits the minibatch
    over all threads (2 threads: 64 B of partials + 12288 B of page-aligned space and barriers)."""
    from peakcut.memory.workspace.conv_geometry import ConvGeometry
    from peakcut.memory.workspace.onednn_wgrad import _bias_reducer

    def threads(n: int) -> CpuMachine:
        return dataclasses.replace(CpuMachine.current(), threads=n)

    g = ConvGeometry(n=2, ic=16, oc=16, ins=(32, 32), outs=(32, 32), ks=(1, 1), stride=(1, 1),
                     padding=(0, 0), dilation=(1, 1), groups=1, isz=4)
    assert _bias_reducer(g, threads(1)) == 0
    assert _bias_reducer(g, threads(2)) == 64 + 12288
    assert _bias_reducer(g, threads(3)) == 64 + 12288  # nthr_per_group = min(3, mb=2)
    assert _bias_reducer(dataclasses.replace(g, oc=32), threads(2)) == 0  # two jobs: one per thread


def test_thnn_conv_columns() -> None:
    """float64 convolutions take the THNN path: one im2col buffer for the whole batch."""
    x, w = R(4, 8, 16, 16, dtype=torch.float64), R(16, 8, 3, 3, dtype=torch.float64)
    measured, model = measure(aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    assert model == 4 * 8 * 9 * 16 * 16 * 8
    assert_close(measured, model)


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (aten.expand.default, (R(1, 64, 1, 28), [8, 64, 28, 28])),
        (aten.permute.default, (R(8, 64, 28, 28), [0, 2, 3, 1])),
        (aten.view.default, (R(8, 64, 28, 28), [8, -1])),
        (aten.mul_.Tensor, (R(64, 128), R(64, 128))),
    ],
    ids=["expand", "permute", "view", "mul_"],
)
def test_views_and_inplace_allocate_nothing(op: torch._ops.OpOverload, args: tuple) -> None:
    """An op returning a view (or mutating in place without promotion) allocates 0 bytes and the
    output accounting counts 0 bytes for it: measured transient is exactly 0, as is the model."""
    events, _ = _alloc_events(op, args, {})
    assert events == []
    assert measure(op, args) == (0, 0)


def test_output_accounting_counts_outputs_once() -> None:
    """Outputs are subtracted from the peak exactly once: a plain op's measured transient is 0."""
    x = R(8, 64, 28, 28)
    events, out = _alloc_events(aten.relu.default, (x,), {})
    assert events == [out.numel() * out.element_size()]
    assert measure(aten.relu.default, (x,)) == (0, 0)


@onednn
def test_unrequested_grad_weight_is_transient() -> None:
    """oneDNN returns grad_weight even when only grad_bias is asked for; the meta kernel does not,
    so the simulator sees it as workspace: the model includes it."""
    args, _ = _conv_bwd((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, (False, False, True))()
    measured, model = measure(aten.convolution_backward.default, args)
    assert model > 64 * 64 * 9 * 4
    assert_close(measured, model)


def test_rule_table_names() -> None:
    ops = workspace_ops()
    assert "aten.convolution.default" in ops
    assert "aten.convolution_backward.default" in ops
    assert "aten.add.Tensor" in ops
    assert "aten.expand.default" not in ops
    assert "aten.add.out" not in ops
    assert all(name.startswith("aten.") and name.count(".") == 2 for name in ops)
    assert workspace_ops() is ops   # enumerated once


def test_unknown_op_is_zero() -> None:
    x = torch.empty(4, 4, device="meta")
    assert cpu_workspace_bytes(aten.topk.default, (x, 2), {}, [x, x]) == 0
    assert cpu_workspace_bytes(aten.expand.default, (x, [4, 4]), {}, [x]) == 0


def test_thread_count_enters_the_model() -> None:
    """layer_norm_backward keeps 2 * nthreads * N partials: the model follows torch.get_num_threads()."""
    x = torch.empty(32, 128, 256, device="meta")
    stats = torch.empty(32, 128, 1, device="meta")
    w = torch.empty(256, device="meta")
    args = (x, x, [256], stats, stats, w, w, [True, True, True])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_workspace_bytes(aten.native_layer_norm_backward.default, args, {}, [x, w, w])
        torch.set_num_threads(2)
        two = cpu_workspace_bytes(aten.native_layer_norm_backward.default, args, {}, [x, w, w])
    finally:
        torch.set_num_threads(before)
    assert (one, two) == (2 * 256 * 4, 2 * 2 * 256 * 4)


@onednn
def test_small_cnn_graph(small_cnn: tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Every op of a traced Core-ATen training step: the rules equal the allocator's transient
    (the convolutions' oneDNN scratch is fitted to AVX-512; the calibrated model, which every
    machine uses by default, is checked everywhere in test_calibrated_workspace.py)."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    model, batch = small_cnn
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}

    def step(p: dict, b: dict, xy: tuple) -> tuple:
        out = torch.func.functional_call(model, (p, b), (xy[0],))
        loss = torch.nn.functional.cross_entropy(out, xy[1])
        return loss, torch.autograd.grad(loss, list(p.values()))

    params_rg = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    gm = make_fx(step, tracing_mode="fake", decomposition_table=core_aten_decompositions())(params_rg, buffers, batch)
    mismatches: list[str] = []

    class Probe(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                measured, modelled = measure(n.target, args, kwargs)
                if abs(measured - modelled) > max(256, 0.02 * measured):
                    mismatches.append(f"{n.target}: measured {measured}, model {modelled}")
            return super().run_node(n)

    with torch.no_grad():
        Probe(gm).run(*tree_flatten((params, buffers, batch))[0])
    assert not mismatches
