"""One-node graphs for cost-model tests, built from meta tensors (no capture needed)."""

from __future__ import annotations

from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.registry import resolve_op
from peakcut.ir.tensor import Role, TensorMeta, dtype_name


class _Builder:
    """Registers tensors of one graph, each in its own storage."""

    def __init__(self) -> None:
        self.tensors: dict[int, TensorMeta] = {}
        self.storages: dict[int, int] = {}

    def add(self, t: torch.Tensor, role: Role) -> int:
        tid = len(self.tensors) + 1
        nbytes = t.untyped_storage().nbytes()
        self.tensors[tid] = TensorMeta(tid, tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype),
                                       tid, 0, role)
        self.storages[tid] = nbytes
        return tid


def _refs(value: Any, builder: _Builder, inputs: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        tid = builder.add(value, Role.INPUT)
        inputs.append(tid)
        return TensorRef(tid)
    if isinstance(value, list):
        return [_refs(v, builder, inputs) for v in value]
    if isinstance(value, tuple):
        return tuple(_refs(v, builder, inputs) for v in value)
    return value


def one_op_graph(op: str, *args: Any, outputs: list[torch.Tensor] | None = None,
                 **kwargs: Any) -> Graph:
    """A graph whose single node (id 100) calls `op` on meta tensors `args` / `kwargs`.

    Outputs are derived by running the op on the meta tensors unless given.
    """
    builder = _Builder()
    inputs: list[int] = []
    node_args = tuple(_refs(a, builder, inputs) for a in args)
    node_kwargs = {k: _refs(v, builder, inputs) for k, v in kwargs.items()}
    if outputs is None:
        result = resolve_op(op)(*args, **kwargs)
        multi = isinstance(result, (tuple, list))
        results = list(result) if multi else [result]
    else:
        multi, results = len(outputs) > 1, outputs
    out_ids = tuple(builder.add(r, Role.ACTIVATION) for r in results)
    node = Node(100, op, node_args, node_kwargs, out_ids, multi_output=multi)
    return Graph(
        tensors=builder.tensors, nodes={100: node}, inputs=inputs,
        input_names=[f"batch:{i}" for i in range(len(inputs))], outputs=list(out_ids),
        output_names=[f"out:{i}" for i in range(len(out_ids))], storages=builder.storages,
        order=[100], control={},
    )


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def mm_graph(m: int, k: int, n: int, dtype: torch.dtype = torch.float32) -> Graph:
    return one_op_graph("aten.mm.default", meta(m, k, dtype=dtype), meta(k, n, dtype=dtype))


def conv_graph(batch: int, channels: int = 64, size: int = 56) -> Graph:
    x, w = meta(batch, channels, size, size), meta(channels, channels, 3, 3)
    return one_op_graph("aten.convolution.default", x, w, None, [1, 1], [1, 1], [1, 1], False,
                        [0, 0], 1)


def add_graph(numel: int, dtype: torch.dtype = torch.float32) -> Graph:
    return one_op_graph("aten.add.Tensor", meta(numel, dtype=dtype), meta(numel, dtype=dtype))


def view_graph(numel: int) -> Graph:
    return one_op_graph("aten.view.default", meta(numel), [numel // 4, 4])


def swap_graph(op: str, numel: int) -> Graph:
    """A peakcut.store (x) or peakcut.load (host, device) node on `numel` fp32 elements."""
    x = meta(numel)
    if op == STORE_OP:
        return one_op_graph(STORE_OP, x, outputs=[meta(numel)])
    if op == LOAD_OP:
        return one_op_graph(LOAD_OP, x, torch.device("cpu"), outputs=[meta(numel)])
    raise ValueError(op)


NODE = 100
