"""Dimension rules (peakcut.ir.dims): splitting a node along any of its labels, running
the parts and merging them gives what the whole op gives.

Call samples: every distinct node (op, input layouts, arguments) of the seven tiny
workloads and the small CNN, captured with AdamW and run eagerly once for real input
values; plus hand-written samples of every other op with a rule. For every label,
n = its smallest divisor >= 2 and its largest divisor <= 4 are checked.

Tolerances: fp32 rtol 1e-5, atol 1e-6; outputs merged from partial results (sums over
a split axis) and outputs of matmuls, convolutions and norms (a part of another size may
take another kernel path) get atol = rtol * max|expected| instead when that is larger
(summation order changes); bf16 rtol 1.6e-2, atol 1e-2 (its own epsilon); fp64 rtol 1e-7,
atol 1e-9.
Outputs of empty* ops are compared by shape and dtype only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import peakcut
from peakcut.ir import Graph, Role, TensorMeta
from peakcut.ir.dims import (
    BUILDERS,
    CAT,
    NO_RULE,
    SAME,
    DimRule,
    Narrow,
    as_outputs,
    dim_rule,
    label_sizes,
    merge_outputs,
    split_node_args,
)
from peakcut.ir.dims.call import Call
from peakcut.ir.node import Node, TensorRef, map_refs
from peakcut.ir.registry import REGISTRY, OpKind, resolve_op
from peakcut.ir.tensor import dtype_name
from peakcut.workloads import WORKLOAD_NAMES, get_workload
from tests.conftest import SmallCNN, cnn_loss

aten = torch.ops.aten
Tensors = Mapping[int, torch.Tensor]
Impl = Callable[..., Any]

# Registry ops without a rule; docs/ir.md ("Dimension rules") lists the same, with reasons.
DOCUMENTED_WITHOUT_RULE = {
    "aten.as_strided.default", "aten._foreach_add_.List", "aten.addmm_.default",
    "aten._foreach_mul_.Scalar", "peakcut.store.default", "peakcut.load.default",
    "peakcut.writeback.default", "peakcut.upload.default",
    "peakcut.skip_update_if.default", "peakcut.spmm.default", "peakcut.nonzero_counted.default",
    "aten.native_dropout.default", "aten.native_dropout_backward.default", "aten.bernoulli.p",
    "aten.bernoulli.default", "aten.bernoulli_.float", "aten.bernoulli_.Tensor",
    "aten.rand.default", "aten.randn.default", "aten.rand_like.default", "aten.randn_like.default",
    "aten.randint.default", "aten.randint_like.default", "aten.normal_.default",
    "aten.uniform_.default", "aten.exponential_.default", "aten.multinomial.default",
    "aten.randperm.default", "peakcut.rng_state.default", "peakcut.set_rng_state.default",
}
# ops that sum internally: a part of a different size may take another kernel path
_CONTRACTING = {OpKind.MATMUL, OpKind.CONV, OpKind.NORM}
_UNINITIALIZED = {"aten.empty.memory_format", "aten.empty_strided.default",
                  "aten.empty_like.default", "aten.new_empty.default",
                  "aten.new_empty_strided.default"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and oversubscribed OpenMP threads
    (parallel test workers) slow every op down by orders of magnitude."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- checking one node
def snapshot(tensors: Tensors) -> dict[int, torch.Tensor]:
    """Independent copies with the same layouts (tensors sharing a storage still share one)."""
    storages: dict[int, torch.UntypedStorage] = {}
    out = {}
    for k, t in tensors.items():
        s = t.untyped_storage()
        copy = storages.setdefault(s.data_ptr(), s.clone())
        out[k] = torch.empty(0, dtype=t.dtype).set_(copy, t.storage_offset(), t.size(), t.stride())
    return out


def split_counts(sizes: set[int]) -> list[int]:
    """n to check for a label: its smallest divisor >= 2 and its largest divisor <= 4."""
    g = math.gcd(*sizes)
    divisors = [d for d in range(2, g + 1) if g % d == 0]
    return sorted({divisors[0], max((d for d in divisors if d <= 4), default=divisors[0])})


def _tolerance(t: torch.Tensor, scaled: bool) -> tuple[float, float]:
    rtol, atol = {torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3),
                  torch.float64: (1e-7, 1e-9)}.get(t.dtype, (1e-5, 1e-6))
    if scaled and t.is_floating_point() and t.numel():
        atol = max(atol, rtol * t.abs().max().item())
    return rtol, atol


def check_split(g: Graph, nid: int, rule: DimRule, inputs: Tensors, label: str, n: int,
                impl: Impl | None = None) -> None:
    """Raise AssertionError unless split-run-merge along `label` equals the whole op
    (outputs, and inputs the op writes in place)."""
    node = g.nodes[nid]
    kind = REGISTRY[node.op].kind
    fn = impl or node.overload()
    whole = snapshot(inputs)
    expected = as_outputs(fn(*map_refs(node.args, lambda r: whole[r.id]),
                             **map_refs(node.kwargs, lambda r: whole[r.id])))
    split = snapshot(inputs)
    parts = []
    for p in range(n):
        call = split_node_args(g, nid, rule, label, n, p)
        if impl is None:
            parts.append(call.run(split))
        else:
            args, kwargs = call.bind(split)
            parts.append(as_outputs(impl(*args, **kwargs)))
    got = merge_outputs(rule, label, parts)
    where = f"{node.op} along {label!r} in {n}"
    assert len(got) == len(expected), where
    for j, (want, have, how) in enumerate(zip(expected, got, rule.combine(label), strict=True)):
        if node.outputs[j] is None:
            continue  # not an output of the graph (a CPU kernel may compute it all the same)
        if want is None:
            assert have is None, f"{where}: output {j} should be None"
            continue
        assert have.shape == want.shape and have.dtype == want.dtype, f"{where}: output {j}"
        if node.op in _UNINITIALIZED:
            continue
        if how == SAME:
            for other in parts[1:]:
                torch.testing.assert_close(
                    other[j], parts[0][j], equal_nan=True,
                    msg=lambda m, j=j: f"{where}: 'same' output {j} differs: {m}")
        rtol, atol = _tolerance(want, how not in (CAT, SAME) or kind in _CONTRACTING)
        torch.testing.assert_close(have, want, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, j=j: f"{where}: output {j}: {m}")
    for t in inputs:
        rtol, atol = _tolerance(whole[t], False)
        torch.testing.assert_close(
            split[t], whole[t], rtol=rtol, atol=atol, equal_nan=True,
            msg=lambda m, t=t: f"{where}: input {t} written differently: {m}")


def check_node(g: Graph, nid: int, rule: DimRule, inputs: Tensors, impl: Impl | None = None) -> int:
    """check_split for every label and split count; returns how many splits were checked."""
    checked = 0
    for label, sizes in sorted(label_sizes(g, nid, rule).items()):
        assert min(sizes) >= 2, f"{g.nodes[nid].op}: label {label!r} carries lengths {sizes}"
        for n in split_counts(sizes):
            check_split(g, nid, rule, inputs, label, n, impl)
            checked += 1
    return checked


# ---------------------------------------------------------------------------- workload samples
@dataclass(frozen=True)
class Sample:
    source: str
    g: Graph
    nid: int
    rule: DimRule
    inputs: Tensors

    @property
    def op(self) -> str:
        return self.g.nodes[self.nid].op


def _bind_inputs(g: Graph, model: torch.nn.Module, batch: Any) -> list[torch.Tensor]:
    """Real values for the program's inputs: the model's parameters and buffers, the batch,
    fresh (zero) optimizer state."""
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    leaves = pytree.tree_flatten(batch)[0]
    values = []
    for t, name in zip(g.inputs, g.input_names, strict=True):
        kind, _, key = name.partition(":")
        meta = g.tensors[t]
        source = {"param": params, "buffer": buffers}.get(kind)
        if source is not None:
            values.append(source[key].detach().clone())
        elif kind == "batch":
            values.append(leaves[int(key)].clone())
        else:
            values.append(torch.zeros(meta.shape, dtype=meta.torch_dtype))
    return values


def _signature(g: Graph, nid: int) -> tuple:
    node = g.nodes[nid]
    metas = [g.tensors[t] for t in node.input_ids()]
    layouts = tuple((m.shape, m.stride, m.dtype) for m in metas)
    arguments = map_refs((node.args, node.kwargs), lambda r: g.tensors[r.id].shape)
    return node.op, layouts, repr(arguments)


def workload_samples(source: str, g: Graph, inputs: list[torch.Tensor],
                     seen: set[tuple]) -> Iterator[Sample]:
    """Run the captured step eagerly; yield each new node with a rule, with its real inputs."""
    env = dict(zip(g.inputs, inputs, strict=True))
    with torch.no_grad():
        for nid in g.order:
            node = g.nodes[nid]
            rule = dim_rule(g, nid)
            key = _signature(g, nid)
            if rule is not None and key not in seen:
                seen.add(key)
                yield Sample(source, g, nid, rule, snapshot({t: env[t] for t in node.input_ids()}))
            result = node.overload()(*map_refs(node.args, lambda r: env[r.id]),
                                     **map_refs(node.kwargs, lambda r: env[r.id]))
            for t, value in zip(node.outputs, as_outputs(result), strict=False):
                if t is not None:
                    env[t] = value


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    seen: set[tuple] = set()
    found: list[Sample] = []
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("tiny")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        found.extend(workload_samples(name, g, _bind_inputs(g, inst.model, inst.batch), seen))
    torch.manual_seed(0)
    model, batch = SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    found.extend(workload_samples("small-cnn", g, _bind_inputs(g, model, batch), seen))
    return found


def test_workload_nodes_split_run_merge(samples: list[Sample]) -> None:
    failures, checked = [], 0
    for s in samples:
        try:
            checked += check_node(s.g, s.nid, s.rule, s.inputs)
        except (AssertionError, RuntimeError, ValueError) as e:
            failures.append(f"[{s.source}] {s.op}: {e}"[:600])
    print(f"{len(samples)} distinct workload nodes with a rule, {checked} splits checked")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    assert checked > 1000


def test_workload_rules_find_the_usual_axes(samples: list[Sample]) -> None:
    """The axes fission needs are labels: batch and out-channels of convolutions, matmul
    m/n/k; training-mode batch norm splits channels only."""
    by_op: dict[str, list[DimRule]] = {}
    for s in samples:
        by_op.setdefault(s.op, []).append(s.rule)
    assert any({"n", "o"} <= r.spatial() for r in by_op["aten.convolution.default"])
    assert any(r.merge.get("k") == "sum" and r.spatial() == {"m", "n"}
               for r in by_op["aten.mm.default"])
    assert all(r.labels() == {"c"} for r in by_op["aten.native_batch_norm.default"])


# ---------------------------------------------------------------------------- hand samples
def one_node_graph(op: str, args: tuple, kwargs: dict | None = None
                   ) -> tuple[Graph, int, dict[int, torch.Tensor]]:
    """A graph holding one call of `op` on concrete tensors (and their values by id)."""
    kwargs = kwargs or {}
    tensors: dict[int, TensorMeta] = {}
    values: dict[int, torch.Tensor] = {}
    by_object: dict[int, int] = {}

    def meta(t: torch.Tensor) -> int:
        tid = len(tensors) + 1
        tensors[tid] = TensorMeta(tid, tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype),
                                  storage=1000 + tid, storage_offset=t.storage_offset(),
                                  role=Role.ACTIVATION)
        return tid

    def ref(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if id(v) not in by_object:
                by_object[id(v)] = meta(v)
                values[by_object[id(v)]] = v
            return TensorRef(by_object[id(v)])
        if isinstance(v, (list, tuple)):
            return type(v)(ref(x) for x in v)
        return v

    node_args, node_kwargs = ref(args), {k: ref(v) for k, v in kwargs.items()}
    # outputs as capture records them: from the meta kernel (a CPU kernel may return
    # outputs its output_mask did not ask for)
    on_meta = {t: v.to("meta") for t, v in values.items()}
    result = resolve_op(op)(*map_refs(node_args, lambda r: on_meta[r.id]),
                            **map_refs(node_kwargs, lambda r: on_meta[r.id]))
    outputs = tuple(None if t is None else meta(t) for t in as_outputs(result))
    node = Node(id=0, op=op, args=node_args, kwargs=node_kwargs, outputs=outputs,
                multi_output=not isinstance(result, torch.Tensor))
    g = Graph(tensors=tensors, nodes={0: node}, inputs=list(values), input_names=[""] * len(values),
              outputs=[], output_names=[], storages={}, order=[0], control={})
    return g, 0, values


def _u(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform in (0.1, 0.9): inside every unary op's domain."""
    return (torch.rand(*shape) * 0.8 + 0.1).to(dtype)


def _n(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def _i(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape)


def _b(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) > 0.5


_UNARY = (
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfinv", "exp", "exp2", "expm1",
    "floor", "log", "log1p", "log2", "neg", "reciprocal", "relu", "round", "rsqrt", "sigmoid",
    "sign", "sgn", "silu", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "isinf",
    "isnan", "gelu", "elu", "relu_", "zero_", "clone", "lift_fresh_copy", "alias", "detach",
    "zeros_like", "ones_like", "empty_like",
)
_SCALAR = {"add.Scalar": 2.0, "add_.Scalar": 2.0, "sub.Scalar": 2.0, "div.Scalar": 3.0,
           "div_.Scalar": 3.0, "mul.Scalar": 3.0, "mul_.Scalar": 3.0, "eq.Scalar": 0.5,
           "ne.Scalar": 0.5, "lt.Scalar": 0.5, "le.Scalar": 0.5, "gt.Scalar": 0.5, "ge.Scalar": 0.5,
           "fmod.Scalar": 0.3, "remainder.Scalar": 0.3, "pow.Tensor_Scalar": 2.0,
           "rsub.Scalar": 1.0, "clamp_min": 0.3, "clamp_max": 0.6, "fill.Scalar": 3.0,
           "fill_.Scalar": 3.0, "full_like": 1.5, "leaky_relu": 0.1}
_BINARY = (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "atan2", "maximum", "minimum",
    "pow.Tensor_Tensor", "fmod.Tensor", "remainder.Tensor", "eq.Tensor", "ne.Tensor", "lt.Tensor",
    "le.Tensor", "gt.Tensor", "ge.Tensor", "rsub.Tensor",
)
_BACKWARD = ("gelu_backward", "sigmoid_backward", "silu_backward", "tanh_backward")
_INPLACE_BINARY = ("add_.Tensor", "sub_.Tensor", "mul_.Tensor", "div_.Tensor", "copy_")


def hand_samples() -> Iterator[tuple[str, tuple, dict]]:
    """(op, args, kwargs) of every rule op the workloads do not exercise (and some they do,
    in other configurations: grouped/transposed convolutions, eval-mode norms, ...)."""
    torch.manual_seed(0)
    x, y = _u(4, 1, 6), _u(3, 6)  # broadcast to [4, 3, 6]
    for name in _UNARY:
        yield f"aten.{name}.default", (_u(4, 1, 6),), {}
    yield "aten.acosh.default", (_u(4, 6) + 1,), {}
    yield "aten.bitwise_not.default", (_i(9, 4, 6),), {}
    yield "aten.logical_not.default", (_b(4, 6),), {}
    yield "aten._to_copy.default", (_u(4, 6),), {"dtype": torch.float64}
    for name, scalar in _SCALAR.items():
        yield f"aten.{name}" if "." in name else f"aten.{name}.default", (_u(4, 6), scalar), {}
    yield "aten.clamp.default", (_u(4, 6), 0.2, 0.7), {}
    yield "aten.hardtanh.default", (_n(4, 6), -0.5, 0.5), {}
    yield "aten.pow.Scalar", (2.0, _u(4, 6)), {}
    for name in _BINARY:
        yield f"aten.{name}" if "." in name else f"aten.{name}.default", (x, y), {}
    yield "aten.div.Tensor_mode", (x, y), {"rounding_mode": "floor"}
    for name in ("logical_and", "logical_or"):
        yield f"aten.{name}.default", (_b(4, 1, 6), _b(3, 6)), {}
    for name in ("bitwise_and.Tensor", "bitwise_or.Tensor"):
        yield f"aten.{name}", (_i(9, 4, 1, 6), _i(9, 3, 6)), {}
    g, a = _n(4, 6), _n(4, 6)
    for name in _BACKWARD:
        yield f"aten.{name}.default", (g, a), {}
    yield "aten.hardtanh_backward.default", (g, a, -0.5, 0.5), {}
    yield "aten.leaky_relu_backward.default", (g, a, 0.1, False), {}
    yield "aten.threshold_backward.default", (g, a, 0.0), {}
    yield "aten.logit_backward.default", (g, _u(4, 6), 1e-6), {}
    yield "aten.lerp.Scalar", (x, y, 0.3), {}
    yield "aten.lerp.Tensor", (x, y, _u(6)), {}
    yield "aten.addcmul.default", (x, y, _u(4, 3, 1)), {"value": 0.5}
    yield "aten.addcdiv.default", (x, y, _u(4, 3, 1)), {"value": 0.5}
    cond = _b(4, 1, 6)
    yield "aten.where.self", (cond, _u(3, 6), _u(4, 3, 1)), {}
    yield "aten.where.ScalarSelf", (cond, 1.0, y), {}
    yield "aten.where.ScalarOther", (cond, y, 2.0), {}
    yield "aten.where.Scalar", (cond, 1.0, 2.0), {}
    yield "aten.masked_fill.Scalar", (_u(4, 3, 6), cond, -1.0), {}
    yield "aten.masked_fill.Tensor", (_u(4, 3, 6), cond, torch.tensor(-1.0)), {}
    yield "aten.fill.Tensor", (_u(4, 6), torch.tensor(2.0)), {}
    yield "aten.copy.default", (_u(4, 3, 6), y), {}
    for name in _INPLACE_BINARY:
        yield f"aten.{name}" if "." in name else f"aten.{name}.default", (_u(4, 3, 6), y), {}
    yield "aten.lerp_.Tensor", (_u(4, 3, 6), y, _u(3, 1)), {}
    yield "aten.lerp_.Scalar", (_u(4, 3, 6), y, 0.3), {}
    yield "aten.addcmul_.default", (_u(4, 3, 6), y, _u(4, 1, 6)), {"value": 0.5}
    yield "aten.addcdiv_.default", (_u(4, 3, 6), y, _u(4, 1, 6)), {"value": 0.5}
    yield "aten.triu.default", (_n(3, 4, 5),), {"diagonal": 1}
    yield "aten.tril.default", (_n(3, 4, 5),), {}
    # factories
    for name in ("empty.memory_format", "zeros.default", "ones.default"):
        yield f"aten.{name}", ([4, 6],), {}
    yield "aten.empty_strided.default", ([4, 6], [1, 4]), {}
    yield "aten.full.default", ([4, 6], 1.5), {}
    for name in ("new_zeros", "new_ones", "new_empty"):
        yield f"aten.{name}.default", (_u(2), [4, 6]), {}
    yield "aten.new_full.default", (_u(2), [4, 6], 2.0), {}
    yield "aten.new_empty_strided.default", (_u(2), [4, 6], [1, 4]), {}
    yield "aten.scalar_tensor.default", (3.0,), {}
    yield "aten.arange.default", (8,), {}
    yield "aten.arange.start", (2, 10), {}
    yield "aten.arange.start_step", (0, 12, 2), {}
    # views
    v = _n(4, 6, 8)
    yield "aten.expand.default", (_n(4, 1, 6), [2, 4, 3, -1]), {}
    yield "aten.permute.default", (v, [2, 0, 1]), {}
    yield "aten.select.int", (v, 1, 2), {}
    yield "aten.slice.Tensor", (v, 2, 1, 5), {}
    yield "aten.slice.Tensor", (v, 1, 0, 100), {}
    yield "aten.narrow.default", (v, 2, 1, 3), {}
    yield "aten.squeeze.dim", (_n(4, 1, 6), 1), {}
    yield "aten.squeeze.dims", (_n(4, 1, 6, 1), [1, -1]), {}
    yield "aten.squeeze.default", (_n(1, 4, 1, 6),), {}
    yield "aten.unsqueeze.default", (v, -1), {}
    yield "aten.t.default", (_n(4, 6),), {}
    yield "aten.transpose.int", (v, 0, 2), {}
    yield "aten.view.default", (v, [24, 8]), {}
    yield "aten.view.default", (_n(24, 8), [4, 6, 2, -1]), {}
    yield "aten.view.default", (_n(6, 4), [4, 6]), {}
    yield "aten._unsafe_view.default", (v, [4, 48]), {}
    yield "aten.unbind.int", (v, 1), {}
    yield "aten.split.Tensor", (v, 3, 1), {}
    yield "aten.split_with_sizes.default", (v, [2, 6], 2), {}
    yield "aten.diagonal.default", (_n(3, 4, 4), 0, 1, 2), {}
    yield "aten.view_as_real.default", (torch.randn(4, 6, dtype=torch.complex64),), {}
    yield "aten.view_as_complex.default", (_n(4, 6, 2),), {}
    yield "aten.unfold.default", (v, 2, 3, 2), {}
    # reductions
    r = _n(4, 6, 8)
    yield "aten.sum.dim_IntList", (r, [1, 2], True), {}
    yield "aten.sum.default", (r,), {}
    yield "aten.mean.dim", (r, [1]), {}
    yield "aten.mean.default", (r,), {}
    yield "aten.amax.default", (r, [0, 2]), {}
    yield "aten.amin.default", (r, [-1], True), {}
    yield "aten.max.dim", (r, 1), {}
    yield "aten.min.dim", (r, 1, True), {}
    yield "aten.argmax.default", (r, 2), {}
    yield "aten.argmax.default", (r, None, True), {}
    yield "aten.argmin.default", (r, 1, True), {}
    yield "aten.var.correction", (r, [1]), {"correction": 1}
    yield "aten.var_mean.correction", (r, [2]), {"keepdim": True}
    yield "aten.prod.dim_int", (_u(4, 6, 8), 2), {}
    yield "aten.prod.default", (_u(4, 6) + 0.5,), {}
    yield "aten.cumsum.default", (r, 1), {}
    yield "aten.any.dim", (_b(4, 6, 8), 1), {}
    yield "aten.any.dims", (_b(4, 6, 8), [0, 2]), {}
    yield "aten.all.dim", (_u(4, 6, 8) > 0.2, 2, True), {}
    yield "aten.logsumexp.default", (r, [1]), {}
    yield "aten.norm.ScalarOpt_dim", (r, 2, [2]), {}
    yield "aten.sum.dim_IntList", (_n(4, 6, 8, dtype=torch.bfloat16), [1]), {}
    yield "aten._softmax.default", (_n(4, 6, 8, dtype=torch.bfloat16), -1, False), {}
    masked = _n(4, 6, 8).masked_fill(_b(4, 6, 8), float("-inf"))   # rows all masked give zeros
    yield "aten._safe_softmax.default", (masked, -1), {}
    q, kv, mask = _n(4, 6, 10, 8), _n(4, 6, 12, 8), _n(1, 6, 10, 12)
    yield "aten._scaled_dot_product_flash_attention_for_cpu.default", (q, kv, kv), {"attn_mask": mask}
    yield "aten._scaled_dot_product_flash_attention_for_cpu.default", (q, kv, kv, 0.0, True), {}
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kv, kv, attn_mask=mask)
    yield ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
           (_n(4, 6, 10, 8), q, kv, kv, out, lse, 0.0, False), {"attn_mask": mask})
    # matmul
    yield "aten.mm.default", (_n(4, 8, dtype=torch.bfloat16), _n(8, 6, dtype=torch.bfloat16)), {}
    yield "aten.addmm.default", (_n(6), _n(4, 8), _n(8, 6)), {}
    yield "aten.addmm.default", (_n(4, 6), _n(4, 8), _n(8, 6)), {"beta": 0}
    yield "aten.baddbmm.default", (_n(3, 1, 6), _n(3, 4, 8), _n(3, 8, 6)), {"beta": 0.5}
    yield "aten.baddbmm.default", (_n(3, 4, 6), _n(3, 4, 8), _n(3, 8, 6)), {"beta": 0}
    yield "aten.dot.default", (_n(8), _n(8)), {}
    yield "aten.mv.default", (_n(6, 8), _n(8)), {}
    # convolutions: grouped, depthwise, transposed, 1-d, with and without bias
    x4 = _n(4, 6, 5, 5)
    conv = [[1, 1], [1, 1], [1, 1], False, [0, 0]]
    yield "aten.convolution.default", (x4, _n(4, 3, 3, 3), _n(4), *conv, 2), {}
    yield "aten.convolution.default", (x4, _n(6, 1, 3, 3), None, *conv, 6), {}
    yield "aten.convolution.default", (x4, _n(4, 6, 3, 3), None, *conv, 1), {}
    tconv = [[2, 2], [1, 1], [1, 1], True, [1, 1]]
    yield "aten.convolution.default", (x4, _n(6, 4, 3, 3), _n(4), *tconv, 1), {}
    yield "aten.convolution.default", (x4, _n(6, 2, 3, 3), _n(4), *tconv, 2), {}
    conv1d = [[2], [0], [1], False, [0], 1]
    yield "aten.convolution.default", (_n(4, 6, 9), _n(4, 6, 3), None, *conv1d), {}
    for weight, groups in ((_n(4, 6, 3, 3), 1), (_n(4, 3, 3, 3), 2)):
        go = _n(4, 4, 5, 5)
        for mask in ([True, True, True], [False, True, True], [True, False, False],
                     [False, False, True]):
            yield ("aten.convolution_backward.default",
                   (go, x4, weight, [4], *conv, groups, mask), {})
    go_t = _n(4, 4, 10, 10)
    for weight, groups in ((_n(6, 4, 3, 3), 1), (_n(6, 2, 3, 3), 2)):
        yield ("aten.convolution_backward.default",
               (go_t, x4, weight, [4], *tconv, groups, [True] * 3), {})
    # norms
    c, run_m, run_v = 6, _n(6), _u(6)
    yield "aten.native_batch_norm.default", (x4, _n(c), _n(c), run_m, run_v, False, 0.1, 1e-5), {}
    yield ("aten._native_batch_norm_legit.default",
           (x4, _n(c), _n(c), _n(c), _u(c), True, 0.1, 1e-5), {})
    yield ("aten._native_batch_norm_legit_no_training.default",
           (x4, _n(c), _n(c), run_m, run_v, 0.1, 1e-5), {})
    for training in (True, False):
        yield ("aten._native_batch_norm_legit_functional.default",
               (x4, _n(c), None, _n(c), _u(c), training, 0.1, 1e-5), {})
    empty = torch.empty(0)
    yield ("aten.native_batch_norm_backward.default",
           (_n(4, 6, 5, 5), x4, _n(c), run_m, run_v, empty, empty, False, 1e-5, [True] * 3), {})
    xg = _n(4, 6, 5, 5)
    _, mean, rstd = aten.native_group_norm(xg, None, None, 4, 6, 25, 3, 1e-5)
    yield "aten.native_group_norm.default", (xg, _n(6), _n(6), 4, 6, 25, 3, 1e-5), {}
    yield ("aten.native_group_norm_backward.default",
           (_n(4, 6, 5, 5), xg, mean, rstd, _n(6), 4, 6, 25, 3, [True, True, True]), {})
    # data movement
    yield "aten.stack.default", ([_n(4, 6), _n(4, 6), _n(4, 6)], 1), {}
    yield "aten.constant_pad_nd.default", (_n(4, 6, 8), [1, 2, 0, 0]), {}
    idx = _i(4, 4, 3, 8)
    yield "aten.scatter.src", (_n(4, 6, 8), 1, idx, _n(4, 3, 8)), {}
    yield "aten.scatter.value", (_n(4, 6, 8), 1, idx, 2.0), {}
    yield "aten.scatter_add.default", (_n(4, 6, 8), 1, idx, _n(4, 3, 8)), {}
    yield "aten.scatter_reduce.two", (_n(4, 6, 8), 1, idx, _n(4, 3, 8), "amax"), {}
    yield "aten.index.Tensor", (_n(4, 6, 8), [None, _i(6, 3, 1), _i(8, 1, 4)]), {}
    yield "aten.index.Tensor", (_n(4, 6, 8), [_i(4, 3), None, _i(8, 3)]), {}
    yield "aten.index_put.default", (_n(4, 6, 8), [None, _i(6, 3)], _n(4, 3, 8)), {}
    yield "aten.index_put_.default", (_n(4, 6, 8), [_i(4, 2)], _n(2, 1, 8), True), {}
    yield "aten.index_select.default", (_n(4, 6, 8), 1, _i(6, 4)), {}
    yield "aten.index_add.default", (_n(4, 6, 8), 1, _i(6, 5), _n(4, 5, 8)), {}
    yield "aten.index_add_.default", (_n(6, 8), 0, _i(6, 9), _n(9, 8)), {}
    yield "aten.elu_backward.default", (_n(4, 6), 1.0, 1, 1, False, _n(4, 6)), {}
    yield "aten.embedding_dense_backward.default", (_n(4, 6, 8), _i(10, 4, 6), 10, -1, True), {}
    p = _n(4, 6, 8, 8)
    yield "aten.avg_pool2d.default", (p, [2, 2], [2, 2]), {}
    yield ("aten.avg_pool2d_backward.default",
           (_n(4, 6, 4, 4), p, [2, 2], [2, 2], [0, 0], False, True, None), {})
    yield "aten._adaptive_avg_pool2d.default", (p, [3, 3]), {}
    yield "aten._adaptive_avg_pool2d_backward.default", (_n(4, 6, 3, 3), p), {}
    yield "aten.upsample_nearest2d.vec", (p, None, [2.0, 2.0]), {}
    yield "aten.upsample_bilinear2d.vec", (p, [12, 12], False, None), {}
    yield "aten.upsample_nearest2d_backward.default", (_n(4, 6, 16, 16), [16, 16], [4, 6, 8, 8]), {}
    yield ("aten.upsample_bilinear2d_backward.default",
           (_n(4, 6, 12, 12), [12, 12], [4, 6, 8, 8], True), {})
    yield "aten.reflection_pad2d.default", (p, [1, 1, 2, 0]), {}
    yield "aten.replication_pad2d.default", (_n(6, 8, 8), [1, 1, 2, 0]), {}
    yield "aten.im2col.default", (p, [3, 3], [1, 1], [1, 1], [2, 2]), {}
    yield "aten.col2im.default", (_n(4, 54, 16), [8, 8], [3, 3], [1, 1], [1, 1], [2, 2]), {}
    logp = torch.log_softmax(_n(8, 5), 1)
    target = torch.tensor([0, 1, -100, 3, 4, -100, -100, -100])
    for reduction in (0, 1, 2):
        yield "aten.nll_loss_forward.default", (logp, target, _u(5), reduction, -100), {}
    yield ("aten.nll_loss_backward.default",
           (_n(8), logp, target, None, 0, -100, torch.tensor(0.0)), {})
    yield ("aten.nll_loss2d_forward.default",
           (torch.log_softmax(_n(2, 3, 4, 4), 1), _i(3, 2, 4, 4), None, 2, -100), {})
    yield "aten.select_scatter.default", (_n(4, 6, 8), _n(4, 8), 1, 2), {}
    yield "aten.slice_scatter.default", (_n(4, 6, 8), _n(4, 6, 3), 2, 1, 7, 2), {}
    yield "aten.flip.default", (_n(4, 6, 8), [1]), {}
    yield "aten.roll.default", (_n(4, 6, 8), [2], [2]), {}
    yield "aten.roll.default", (_n(4, 6), [2]), {}
    yield "aten.repeat.default", (_n(6, 1, 4), [2, 1, 3, 1]), {}
    yield "aten.sort.default", (_n(4, 6, 8), 1), {}
    yield "aten.topk.default", (_n(4, 6, 8), 3), {}


def test_hand_samples_split_run_merge() -> None:
    failures, checked, ops = [], 0, set()
    for op, args, kwargs in hand_samples():
        g, nid, inputs = one_node_graph(op, args, kwargs)
        rule = dim_rule(g, nid)
        assert rule is not None, f"{op}: no rule"
        ops.add(op)
        try:
            checked += check_node(g, nid, rule, inputs)
        except (AssertionError, RuntimeError, ValueError) as e:
            failures.append(f"{op}: {e}"[:600])
    print(f"{len(ops)} ops in hand samples, {checked} splits checked")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def efficient_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attn_bias: torch.Tensor | None, compute_log_sumexp: bool,
                                  dropout_p: float = 0.0, is_causal: bool = False, *,
                                  scale: float | None = None) -> tuple[torch.Tensor, ...]:
    """_scaled_dot_product_efficient_attention without dropout, in plain math (the op has no
    CPU kernel). log_sumexp is padded to a multiple of 32 rows as the CUDA kernel pads it."""
    scores = query @ key.transpose(-2, -1) * (scale or query.shape[-1] ** -0.5)
    if attn_bias is not None:
        scores = scores + attn_bias
    if is_causal:
        above = torch.ones_like(scores, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    lse = scores.logsumexp(-1)
    rows = -(-query.shape[2] // 32) * 32 if compute_log_sumexp else 0
    padded = torch.zeros(*lse.shape[:2], rows)
    padded[..., : min(rows, lse.shape[-1])] = lse[..., :rows]
    seed = torch.tensor(0, dtype=torch.int64)
    return scores.softmax(-1) @ value, padded, seed, seed.clone()


def test_efficient_attention_splits_batch_and_heads() -> None:
    """No CPU kernel: shapes come from the op's meta kernel, values from the math reference."""
    op = "aten._scaled_dot_product_efficient_attention.default"
    q, k, bias = _n(4, 6, 40, 8), _n(4, 6, 24, 8), _n(1, 6, 40, 24)
    for args in ((q, k, k, bias, True), (q, k, k, None, False, 0.0, True)):
        metas = as_outputs(resolve_op(op)(*[a.to("meta") if isinstance(a, torch.Tensor) else a
                                            for a in args]))
        reference = efficient_attention_reference(*args)
        assert [t.shape for t in metas] == [t.shape for t in reference]
        g, nid, inputs = one_node_graph(op, args)
        rule = dim_rule(g, nid)
        assert rule is not None and rule.labels() == {"b", "h"}
        assert check_node(g, nid, rule, inputs, impl=efficient_attention_reference) == 4
    g, nid, _ = one_node_graph(op, (q, k, k, None, False, 0.1))
    assert dim_rule(g, nid) is None  # dropout draws random numbers


def test_every_rule_op_is_exercised(samples: list[Sample]) -> None:
    """Every op with a rule has a checked sample with at least one label, except the ops whose
    rules never have labels."""
    exercised = {s.op for s in samples if s.rule.labels()}
    for op, args, kwargs in hand_samples():
        g, nid, _ = one_node_graph(op, args, kwargs)
        rule = dim_rule(g, nid)
        if rule is not None and rule.labels():
            exercised.add(op)
    exercised.add("aten._scaled_dot_product_efficient_attention.default")  # test above
    never_labelled = {"aten.arange.default", "aten.arange.start", "aten.arange.start_step",
                      "aten.scalar_tensor.default"}
    assert set(BUILDERS) - exercised == never_labelled


def test_ops_without_rule_are_the_documented_ones() -> None:
    without = sorted(set(REGISTRY) - set(BUILDERS))
    listing = "\n  ".join(f"{op}: {NO_RULE[op]}" for op in without)
    print(f"registry ops without a dimension rule ({len(without)}):\n  {listing}")
    assert set(without) == DOCUMENTED_WITHOUT_RULE == set(NO_RULE)
    docs = (Path(__file__).parents[2] / "docs" / "ir.md").read_text()
    short = {op.removeprefix("aten.").removesuffix(".default") for op in without}
    assert all(name in docs for name in short)


# ---------------------------------------------------------------------------- tricky cases
def _rule(op: str, *args: Any,
          **kwargs: Any) -> tuple[Graph, int, DimRule, dict[int, torch.Tensor]]:
    g, nid, inputs = one_node_graph(op, args, kwargs)
    rule = dim_rule(g, nid)
    assert rule is not None
    return g, nid, rule, inputs


def test_broadcasting_aligns_from_the_right() -> None:
    g, nid, rule, inputs = _rule("aten.add.Tensor", _n(4, 1, 6), _n(3, 6))
    assert rule.outputs == (("d0", "d1", "d2"),)
    assert rule.inputs == (("d0", None, "d2"), ("d1", "d2"))
    check_node(g, nid, rule, inputs)


def test_reshape_links_outermost_dims_of_merged_blocks() -> None:
    # [32, 512, 768] -> [32, 512, 12, 64] -> permute(0, 2, 1, 3), at a tenth of the size
    x = _n(4, 16, 24)
    g, nid, view, inputs = _rule("aten.view.default", x, [4, 16, 6, 4])
    assert view.inputs == (("v0", "v1", "v2"),) and view.outputs == (("v0", "v1", "v2", None),)
    assert view.args["size"] == ("v0", "v1", "v2", None)
    check_node(g, nid, view, inputs)
    _, _, perm, _ = _rule("aten.permute.default", x.view(4, 16, 6, 4), [0, 2, 1, 3])
    assert perm.outputs == (("d0", "d2", "d1", "d3"),)
    # flatten: the batch is the outer dim of B*T, and splits it contiguously
    g, nid, flat, inputs = _rule("aten.view.default", x, [64, 24])
    assert flat.inputs == (("v0", None, "v1"),) and flat.outputs == (("v0", "v1"),)
    assert label_sizes(g, nid, flat)["v0"] == {4, 64}
    check_node(g, nid, flat, inputs)
    g, nid, unflat, inputs = _rule("aten.view.default", _n(64, 24), [4, 16, -1])
    assert unflat.outputs == (("v0", None, "v1"),) and unflat.args["size"] == ("v0", None, None)
    check_node(g, nid, unflat, inputs)


def test_keepdim_reduction_and_mean_merge() -> None:
    g, nid, rule, inputs = _rule("aten.mean.dim", _n(4, 6, 3, 3), [-1, -2], True)
    assert rule.outputs == (("d0", "d1", None, None),)
    assert rule.merge == {"r2": "mean", "r3": "mean"} and rule.reduce() == {"r2", "r3"}
    check_node(g, nid, rule, inputs)
    g, nid, rule, inputs = _rule("aten.mean.dim", _n(4, 6, 8), [1])
    assert rule.combine("r1") == ("mean",)
    check_split(g, nid, rule, inputs, "r1", 3)


def test_nll_loss_mean_merges_by_total_weight() -> None:
    """Parts see different numbers of ignored targets (one part none at all): a plain mean of
    the parts would be wrong; the parts run as sums and divide by the total weight."""
    logp = torch.log_softmax(_n(8, 5), 1)
    target = torch.tensor([0, 1, 2, -100, -100, -100, -100, -100])
    g, nid, rule, inputs = _rule("aten.nll_loss_forward.default", logp, target, None, 1, -100)
    assert rule.merge == {"n": "nll_mean"} and rule.combine("n") == ("nll_mean", "nll_mean")
    assert split_node_args(g, nid, rule, "n", 2, 0).args[3] == 2  # reduction=sum per part
    for n in (2, 4):
        check_split(g, nid, rule, inputs, "n", n)
    g, nid, rule, inputs = _rule("aten.nll_loss_backward.default", torch.tensor(1.0), logp, target,
                                 None, 1, -100, torch.tensor(3.0))
    assert rule.inputs[0] == () and rule.inputs[-1] == ()  # grad and total_weight stay whole
    check_node(g, nid, rule, inputs)


def test_weight_gradients_sum_over_the_batch() -> None:
    x, go = _n(4, 6, 5, 5), _n(4, 8, 5, 5)
    g, nid, rule, inputs = _rule("aten.convolution_backward.default", go, x, _n(8, 6, 3, 3), [8],
                                 [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    assert rule.combine("n") == (CAT, "sum", "sum")
    assert rule.combine("o") == ("sum", CAT, CAT)
    assert rule.combine("c") == (CAT, CAT, SAME)  # grad_bias does not depend on in-channels
    check_node(g, nid, rule, inputs)
    # linear weight gradient: grad.t() @ x, k = the batch
    g, nid, rule, inputs = _rule("aten.mm.default", _n(12, 8).t(), _n(12, 6))
    assert rule.reduce() == {"k"} and rule.merge["k"] == "sum"
    check_split(g, nid, rule, inputs, "k", 4)


def test_bias_added_once_blocks_the_contracted_axis() -> None:
    _, _, rule, _ = _rule("aten.addmm.default", _n(6), _n(4, 8), _n(8, 6))
    assert rule.labels() == {"m", "n"}
    _, _, rule, _ = _rule("aten.convolution.default", _n(2, 6, 5, 5), _n(4, 6, 3, 3), _n(4),
                          [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert rule.labels() == {"n", "o"}


def test_call_shapes_of_required_and_optional_tensors() -> None:
    """Builders read a required tensor's shape with Call.shape (an absent one is an error) and an
    optional tensor's with Call.optional_shape (None when the call passes None)."""
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    g, nid, _ = one_node_graph("aten.convolution.default",
                               (_n(2, 6, 5, 5), _n(4, 6, 3, 3), None, *conv), {})
    call = Call.of(g, nid)
    assert call.shape("weight") == (4, 6, 3, 3) == call.optional_shape("weight")
    assert call.optional_shape("bias") is None
    with pytest.raises(ValueError, match="'bias' is not a tensor"):
        call.shape("bias")


def test_written_inputs_must_carry_every_label() -> None:
    """Eval-mode batch norm is element-wise, but it counts as writing its running statistics
    (registry: undeclared writes), which carry only the channel: a batch split would update
    them n times, so the batch is dropped."""
    _, _, rule, _ = _rule("aten.native_batch_norm.default", _n(4, 6, 5, 5), _n(6), _n(6), _n(6),
                          _u(6), False, 0.1, 1e-5)
    assert rule.labels() == {"c"}
    _, _, rule, _ = _rule("aten._native_batch_norm_legit_no_training.default", _n(4, 6, 5, 5),
                          _n(6), _n(6), _n(6), _u(6), 0.1, 1e-5)
    assert rule.labels() == {"n", "c", "s0", "s1"}


def test_tensor_read_twice_with_different_axes_loses_them() -> None:
    x = _n(6, 6)
    _, _, rule, _ = _rule("aten.mm.default", x, x)
    assert rule.labels() == set()
    _, _, rule, _ = _rule("aten.mul.Tensor", x, x)
    assert rule.labels() == {"d0", "d1"}


def test_split_node_args_divides_size_arguments() -> None:
    g, nid, rule, _ = _rule("aten.expand.default", _n(4, 1, 6), [2, 4, 3, -1])
    assert rule.args["size"] == ("d0", "d1", "d2", None)
    part = split_node_args(g, nid, rule, "d2", 3, 1)
    assert part.args[1] == [2, 4, 1, -1] and part.narrows == {}
    part = split_node_args(g, nid, rule, "d1", 2, 1)
    assert part.args[1] == [2, 2, 3, -1] and part.narrows == {1: Narrow(dim=0, start=2, length=2)}
    with pytest.raises(ValueError, match="equal parts"):
        split_node_args(g, nid, rule, "d1", 3, 0)


def test_part_calls_work_around_kernel_quirks() -> None:
    """native_layer_norm_backward reads mean/rstd as if contiguous (CPU): parts along an inner
    axis get contiguous copies. squeeze() would also drop an axis a part cuts to length 1: its
    parts run as squeeze.dims of the axes the whole call drops."""
    x = _n(4, 6, 8)
    _, mean, rstd = aten.native_layer_norm(x, [8], None, None, 1e-5)
    g, nid, rule, inputs = _rule("aten.native_layer_norm_backward.default", _n(4, 6, 8), x, [8],
                                 mean, rstd, None, None, [True, False, False])
    part = split_node_args(g, nid, rule, "b1", 2, 0)
    assert part.contiguous == {3, 4} and set(part.narrows) == {1, 2, 3, 4}  # mean, rstd
    check_split(g, nid, rule, inputs, "b1", 3)
    g, nid, rule, inputs = _rule("aten.squeeze.default", _n(1, 4, 1, 6))
    part = split_node_args(g, nid, rule, "d1", 4, 0)
    assert part.op == "aten.squeeze.dims" and part.args[1] == [0, 2]
    check_split(g, nid, rule, inputs, "d1", 4)
