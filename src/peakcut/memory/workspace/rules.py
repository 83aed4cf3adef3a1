"""The CPU workspace rule of each ATen op family, and the bytes of one op call.

    cpu_workspace_bytes(op, args, kwargs, outputs, machine)   # tensors as meta tensors

Ops without a rule take no workspace (0). `workspace_ops()` names every overload with a
rule; it enumerates ATen's overloads once, when first asked.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from peakcut.memory.workspace import convolution, indexing, matmul, norms, pointwise, reductions
from peakcut.memory.workspace.call import OpCall, Rule, bind
from peakcut.memory.workspace.machine import CpuMachine

RULES: Mapping[str, Rule] = types.MappingProxyType({
    **pointwise.RULES, **reductions.RULES, **norms.RULES, **indexing.RULES, **matmul.RULES,
    **convolution.RULES,
})
"""Op family (the schema name without namespace, e.g. 'convolution_backward') -> its rule."""


def _is_out_variant(op: torch._ops.OpOverload) -> bool:
    return any(arg.is_out for arg in op._schema.arguments)


@functools.cache
def workspace_ops() -> frozenset[str]:
    """``str(op)`` of every overload with a (possibly) nonzero rule, e.g.
    ``"aten.convolution.default"`` (computed on the first call)."""
    aten = torch.ops.aten
    names: set[str] = set()
    for family in RULES:
        packet = getattr(aten, family, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if _is_out_variant(op) or not any("Tensor" in str(a.type) for a in op._schema.arguments):
                continue
            names.add(f"aten.{family}.{overload}")
    return frozenset(names)


def cpu_workspace_bytes(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any],
                        outputs: Sequence[Any], machine: CpuMachine | None = None) -> int:
    """Transient CPU allocator bytes the op takes beyond its outputs while it runs.

    ``args``/``kwargs`` are the op's arguments with tensors as meta tensors (shape, dtype and
    strides matter), ``outputs`` its (meta) output tensors. Unknown ops return 0. machine:
    the CPU modelled (default: CpuMachine.current(), this process's).
    """
    name = str(op._schema.name)
    if name.split("::")[0] != "aten":
        return 0
    rule = RULES.get(name.split("::")[-1])
    if rule is None or _is_out_variant(op):
        return 0
    outs = tuple(o for o in outputs if isinstance(o, torch.Tensor))
    call = OpCall(op=op, args=bind(op, tuple(args), dict(kwargs)), outputs=outs,
                  machine=CpuMachine.current() if machine is None else machine)
    return max(int(rule(call)), 0)
