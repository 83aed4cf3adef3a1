"""Real argument tensors for timing one node standalone.

Every tensor argument is built as peakcut.ir.real_tensors.real_tensor builds it (the recorded
layout; floating tensors a block of |randn| values repeated, from a private generator;
integer and bool tensors zero). A tensor referenced twice by the same call is built once, so
aliasing arguments stay aliased.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.real_tensors import INPUT_SEED, real_tensor
from peakcut.ir.tensor import TensorMeta

VALUE_CHECKED_OPS = frozenset({
    "aten.binary_cross_entropy.default", "aten.binary_cross_entropy_backward.default",
    "aten.bernoulli.default", "aten.bernoulli.p", "aten.bernoulli_.Tensor", "aten.bernoulli_.float",
    "aten.multinomial.default",
})
"""Ops whose CUDA kernels check their inputs' values with device-side asserts (probabilities
in [0, 1]); |randn| inputs break them, and an assert ends the process's CUDA context, so they
are never run on synthetic inputs on a GPU (timing and workspace use their fallbacks)."""


@dataclass(frozen=True)
class RealCall:
    """An op overload with real arguments, ready to be called as the program calls it."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return self.op(*self.args, **self.kwargs)


def error_line(error: BaseException) -> str:
    """'RuntimeError: first line of the message': why a call could not run on synthetic inputs."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def input_bytes(g: Graph, nid: int) -> int:
    """Bytes of the distinct tensor arguments of node `nid` (what building them allocates)."""
    return sum(g.tensors[t].nbytes for t in g.nodes[nid].input_ids())


def call_bytes(g: Graph, nid: int) -> int:
    """Bytes of node `nid`'s tensor arguments and outputs: what running it standalone holds."""
    return input_bytes(g, nid) + sum(g.tensors[t].nbytes for t in g.nodes[nid].output_ids())


@dataclass(frozen=True)
class CallSpec:
    """A node's call as plain data: the node and the layouts of the tensors it reads. It
    pickles, so a call priced where its graph lives (a forked search) runs elsewhere."""

    node: Node
    tensors: dict[int, TensorMeta]


def call_spec(g: Graph, nid: int) -> CallSpec:
    """Node `nid`'s call as plain data (CallSpec)."""
    node = g.nodes[nid]
    return CallSpec(node, {t: g.tensors[t] for t in node.input_ids()})


def real_call(g: Graph, nid: int, device: torch.device) -> RealCall:
    """Node `nid` with real tensors on `device` (devices in its arguments replaced by it)."""
    return spec_call(call_spec(g, nid), device)


def spec_call(spec: CallSpec, device: torch.device) -> RealCall:
    """The call of `spec` with real tensors on `device` (devices in its arguments replaced by it)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(INPUT_SEED)
    built: dict[int, torch.Tensor] = {}

    def tensor(ref: TensorRef) -> torch.Tensor:
        if ref.id not in built:
            built[ref.id] = real_tensor(spec.tensors[ref.id], device, generator)
        return built[ref.id]

    def convert(value: Any) -> Any:
        return _map_args(value, tensor, device)

    node = spec.node
    return RealCall(node.overload(), tuple(convert(a) for a in node.args),
                    {k: convert(v) for k, v in node.kwargs.items()})


def _map_args(value: Any, tensor: Callable[[TensorRef], torch.Tensor], device: torch.device) -> Any:
    """Rebuild nested arguments with real tensors and the timing device."""
    if isinstance(value, TensorRef):
        return tensor(value)
    if isinstance(value, torch.device):
        return device
    if isinstance(value, list):
        return [_map_args(v, tensor, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_map_args(v, tensor, device) for v in value)
    if isinstance(value, dict):
        return {k: _map_args(v, tensor, device) for k, v in value.items()}
    return value
