"""An op's `out=` overload: the call that writes its results into tensors the caller gives.

    found = out_variant("aten.mm.default")   # OutVariant(op="aten.mm.out", names=("out",))
    found = out_variant("aten.view.default") # None: a view has no out overload

An overload of the same op packet is the out variant when its arguments are the functional
overload's (same names and types, in order) followed by keyword-only out arguments, one per
result (`out`, or `out0, out1, ...`, or `out, save_mean, ...`). Whether it really writes into
the given tensors, or computes elsewhere and copies, is the probe's question
(codegen.arena_probe).

A few ops that make a tensor from a value are written as an in-place method on the given
tensor instead (INPLACE_FORMS): a clone or a same-device dtype cast as `copy_` of its input,
zeros as `zero_()`, ones and fills as `fill_(value)`; these write in place by definition and
need no probe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from peakcut.codegen.calls import op_target


@dataclass(frozen=True)
class OutVariant:
    """The out overload of an op ('ns.op.overload'), and its out arguments' names."""

    op: str
    names: tuple[str, ...]
    method: str = ""                 # an in-place form: the method called on the given tensor
    arg: int | str | None = None     # its argument: the op's positional argument at that index, or source

    @property
    def target(self) -> str:
        """The call target as source ('aten.mm.out')."""
        return op_target(self.op)


def overload_of(op: str) -> torch._ops.OpOverload | None:
    """The OpOverload named 'ns.op.overload', or None when torch has none of that name."""
    parts = op.split(".")
    if len(parts) != 3:
        return None
    ns, name, overload = parts
    try:
        found = getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None


INPLACE_FORMS: dict[str, tuple[str, int | str | None]] = {
    "aten.clone.default": ("copy_", 0),
    "aten._to_copy.default": ("copy_", 0),
    "aten.zeros.default": ("zero_", None),
    "aten.zeros_like.default": ("zero_", None),
    "aten.new_zeros.default": ("zero_", None),
    "aten.ones.default": ("fill_", "1"),
    "aten.ones_like.default": ("fill_", "1"),
    "aten.new_ones.default": ("fill_", "1"),
    "aten.full.default": ("fill_", 1),
    "aten.full_like.default": ("fill_", 1),
    "aten.scalar_tensor.default": ("fill_", 0),
}
"""Ops written as an in-place method on the given tensor (module doc): op -> (method, argument)."""


def out_variant(op: str) -> OutVariant | None:
    """The out overload of op 'ns.op.overload' (module doc), or None when it has none."""
    form = INPLACE_FORMS.get(op)
    if form is not None:
        return OutVariant(op="", names=("out",), method=form[0], arg=form[1])
    functional = overload_of(op)
    if functional is None:
        return None
    schema = functional._schema
    if schema.is_mutable or not schema.returns:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments]
    packet = functional.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        arguments = candidate._schema.arguments
        outs = [a for a in arguments if a.is_out]
        if not outs or len(outs) != len(schema.returns) or any(str(a.type) != "Tensor" for a in outs):
            continue
        if [(a.name, str(a.type)) for a in arguments if not a.is_out] == wanted:
            ns, base, _ = op.split(".")
            return OutVariant(op=f"{ns}.{base}.{name}", names=tuple(a.name for a in outs))
    return None
