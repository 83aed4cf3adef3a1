"""Random training steps that hold the source graphs of generated substitutions.

A unit is one rule's source graph (peakcut.taso: its `src` term) at random sizes of its size
terms (m, n, k; "1" dims stay 1), computed by the rule's own ATen calls (peakcut.taso.calls)
from its inputs. Each input is, at random, a parameter, a batch tensor, or an activation (a
parameter times a batch tensor); every unit has at least one parameter behind it, so
gradients flow back through the source's ops. The loss reads each unit's result through a
random weight of its shape (a batch tensor) and sums the units. A model holds many units,
each a submodule `units.<i>` whose nodes carry that module path in the capture (that is how
bench.fuzz.generated finds a unit's own site).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from peakcut.taso import Rule
from peakcut.taso.calls import Call, Ref, calls, run
from peakcut.taso.ops import dim_size
from peakcut.taso.term import shape_of

KINDS = ("param", "batch", "activation")


def aten(name: str) -> Callable[..., Any]:
    """The OpOverload of an ATen name ('aten.mm.default')."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


@dataclass(frozen=True)
class UnitSpec:
    """One rule's source at `sizes`; `kinds` says what each input is (KINDS)."""

    index: int                      # the rule's index in GeneratedRule().rules()
    rule: Rule
    sizes: Mapping[str, int]
    kinds: Mapping[str, str]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(dim_size(d, self.sizes) for d in self.rule.inputs[name])

    def result_shape(self) -> tuple[int, ...]:
        shape = shape_of(self.rule.src, self.rule.inputs, {})
        if shape is None:
            raise ValueError(f"{self.rule.describe()}: its source has no shape")
        return tuple(dim_size(d, self.sizes) for d in shape)

    def describe(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in sorted(self.sizes.items()))
        kinds = " ".join(f"{n}:{k}" for n, k in sorted(self.kinds.items()))
        return f"{self.rule.name} [{sizes}] [{kinds}]"


def draw_unit(rng: random.Random, index: int, rule: Rule) -> UnitSpec:
    """The rule's source at random sizes (2..7, sometimes 1) with random input kinds."""
    terms = sorted({d[0] for shape in rule.inputs.values() for d in shape if d[0] != "1"})
    sizes = {t: 1 if rng.random() < 0.1 else rng.randint(2, 7) for t in terms}
    names = sorted(rule.inputs)
    kinds = {n: rng.choice(KINDS) for n in names}
    if all(k == "batch" for k in kinds.values()):
        kinds[rng.choice(names)] = rng.choice(["param", "activation"])
    return UnitSpec(index, rule, sizes, kinds)


class Unit(nn.Module):
    """A unit's parameters; forward(batch tensors by name) -> the source's result."""

    def __init__(self, spec: UnitSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.spec = spec
        self.program: tuple[list[Call], Ref] = calls(spec.rule.src, spec.rule.inputs, spec.sizes)
        for name, kind in sorted(spec.kinds.items()):
            if kind != "batch":
                self.register_parameter(name, nn.Parameter(torch.randn(spec.shape(name), dtype=dtype)))

    def forward(self, fed: Mapping[str, torch.Tensor]) -> torch.Tensor:
        tensors: dict[str, torch.Tensor] = {}
        for name, kind in self.spec.kinds.items():
            if kind == "param":
                tensors[name] = getattr(self, name)
            elif kind == "batch":
                tensors[name] = fed[name]
            else:
                tensors[name] = getattr(self, name) * fed[name]
        return run(self.program, tensors, aten)


class UnitsModel(nn.Module):
    """Units side by side; forward(batch) -> the loss: sum over units of (result * weight).sum()."""

    def __init__(self, specs: list[UnitSpec], dtype: torch.dtype) -> None:
        super().__init__()
        self.units = nn.ModuleList(Unit(s, dtype) for s in specs)
        # the batch: per unit its fed inputs (sorted by name), then its loss weight
        self.layout = [[n for n, k in sorted(s.kinds.items()) if k != "param"] for s in specs]

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        at, total = 0, None
        for unit, names in zip(self.units, self.layout, strict=True):
            fed = dict(zip(names, batch[at:at + len(names)], strict=True))
            weight = batch[at + len(names)]
            at += len(names) + 1
            term = (unit(fed) * weight).sum()
            total = term if total is None else total + term
        if total is None:
            raise ValueError("UnitsModel: no units")
        return total

    def make_batch(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Random batch tensors (torch's generator), in forward's order."""
        out: list[torch.Tensor] = []
        for unit, names in zip(self.units, self.layout, strict=True):
            spec = unit.spec
            if not isinstance(spec, UnitSpec):
                raise TypeError(f"UnitsModel: unit {unit!r} has no UnitSpec")
            out += [torch.randn(spec.shape(n), dtype=dtype) for n in names]
            out.append(torch.randn(spec.result_shape(), dtype=dtype))
        return tuple(out)
