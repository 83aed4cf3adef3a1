"""One op call as Python source: the ATen target and its arguments, literals and tensor names."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from peakcut.ir.collectives import RUN_AS
from peakcut.ir.node import Hyper, Node, TensorRef
from peakcut.ir.ops import RNG_STATE_OP, SET_RNG_STATE_OP


def literal(v: Any, names: Mapping[int, str], device: str) -> str:
    """An argument's source: a tensor by its name in `names`, a run-time scalar as hp[...], the
    step's device as `device`, anything else as a literal."""
    if isinstance(v, TensorRef):
        return names[v.id]
    if isinstance(v, Hyper):
        return f"hp[{v.name!r}]"
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(literal(x, names, device) for x in v) + "]"
    if isinstance(v, tuple):
        inner = ", ".join(literal(x, names, device) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return "device" if str(v) == device else f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    raise TypeError(f"cannot emit argument of type {type(v).__name__}: {v!r}")


def op_target(op: str) -> str:
    """'aten.mm.default' -> 'aten.mm.default'; 'ns.op.overload' -> 'torch.ops.ns.op.overload';
    an op run through another (collectives.RUN_AS: the all-gather) -> that one."""
    ns, name, overload = RUN_AS.get(op, op).split(".")
    return f"aten.{name}.{overload}" if ns == "aten" else f"torch.ops.{ns}.{name}.{overload}"


def argument_sources(node: Node, names: Mapping[int, str], device: str,
                     override: Mapping[int, str] | None = None) -> list[str]:
    """The call's arguments as source, positional then `key=value`; override: positional
    argument index -> source text to use instead."""
    override = override or {}
    parts = [override[i] if i in override else literal(a, names, device) for i, a in enumerate(node.args)]
    parts += [f"{k}={literal(v, names, device)}" for k, v in node.kwargs.items()]
    return parts


def call_source(node: Node, names: Mapping[int, str], device: str,
                override: Mapping[int, str] | None = None) -> str:
    """The op call's source; override: positional argument index -> source text to use."""
    if node.op in (RNG_STATE_OP, SET_RNG_STATE_OP):
        return rng_call_source(node, names, device)
    return f"{op_target(node.op)}({', '.join(argument_sources(node, names, device, override))})"


def rng_call_source(node: Node, names: Mapping[int, str], device: str) -> str:
    """A generator state read or set as PyTorch's own call: torch.get_rng_state(),
    torch.cuda.set_rng_state(state, device), ..."""
    *state, where = node.args
    generator = torch.device(where)
    module = "torch" if generator.type == "cpu" else f"torch.{generator.type}"
    on = [] if generator.type == "cpu" else [literal(generator, names, device)]
    if node.op == RNG_STATE_OP:
        return f"{module}.get_rng_state({', '.join(on)})"
    return f"{module}.set_rng_state({', '.join([literal(state[0], names, device), *on])})"
