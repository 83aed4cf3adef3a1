"""A fixed mix of cheap calls typical of a training step, on small tensors.

Views, element-wise ops, in-place optimizer updates, reductions and a small matmul on 8 x 32
fp32 tensors. The measured model uses the mix twice: as the body of the generated program
that calibrates the per-line overhead (peakcut.cost.overhead), and as filler between the
calls of a small measurement batch, so that every timed call follows *other* ops, as it does
in a program (see peakcut.cost.timer.time_interleaved).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.cost.inputs import RealCall
from peakcut.ir.registry import resolve_op


@dataclass(frozen=True)
class _Operand:
    """A named tensor operand of the mix."""

    name: str

    def __repr__(self) -> str:
        return self.name


A, B, C, M, W, R, S = (_Operand(n) for n in "abcmwrs")
OPERAND_NAMES: tuple[str, ...] = ("a", "b", "c", "m", "w", "r", "s")

MIX: tuple[tuple[str, tuple[Any, ...], dict[str, Any]], ...] = (
    ("aten.view.default", (A, [32, 8]), {}),
    ("aten.add.Tensor", (A, B), {}),
    ("aten.t.default", (A,), {}),
    ("aten.mul.Tensor", (A, B), {}),
    ("aten.mul_.Tensor", (C, S), {}),
    ("aten.detach.default", (A,), {}),
    ("aten.div.Tensor", (A, B), {}),
    ("aten.sqrt.default", (A,), {}),
    ("aten.transpose.int", (M, 0, 1), {}),
    ("aten.addcmul_.default", (C, A, B), {"value": 0.001}),
    ("aten.mm.default", (A, W), {}),
    ("aten.unsqueeze.default", (A, 0), {}),
    ("aten.sum.dim_IntList", (A, [0], True), {}),
    ("aten.lerp_.Scalar", (C, A, 0.1), {}),
    ("aten.relu.default", (A,), {}),
    ("aten.clone.default", (A,), {}),
    ("aten.expand.default", (R, [8, 32]), {}),
    ("aten.addcdiv_.default", (C, A, B), {"value": -0.001}),
    ("aten.gelu.default", (A,), {}),
    ("aten.add_.Tensor", (C, A), {"alpha": 0.5}),
)
"""(op, positional args, keyword args) of every call in the mix."""


def mix_operands(device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors the mix works on (positive values: no NaNs from sqrt)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(0)

    def positive(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=generator, device=device) + 0.5

    return {
        "a": positive(8, 32), "b": positive(8, 32), "c": positive(8, 32),
        "m": positive(8, 32, 4), "w": positive(32, 32), "r": positive(1, 32),
        "s": torch.tensor(1.0, device=device),
    }


def mix_calls(operands: dict[str, torch.Tensor]) -> list[RealCall]:
    """Every call of the mix with real operands, callable like a measured node."""

    def real(value: Any) -> Any:
        return operands[value.name] if isinstance(value, _Operand) else value

    return [RealCall(resolve_op(op), tuple(real(a) for a in args),
                     {k: real(v) for k, v in kwargs.items()}) for op, args, kwargs in MIX]


def call_text(index: int) -> str:
    """'aten.add.Tensor(a, b)': the line a generated program would hold for MIX[index]."""
    op, args, kwargs = MIX[index]
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{op}({', '.join(parts)})"


def mix_program(lines: list[int]) -> Callable[..., Any]:
    """`program(a, b, c, m, w, r, s)` calling MIX[i] for each i in `lines`, written as
    peakcut.codegen.source writes programs: one call per line, a `del` after the last use."""
    source = [f"def program({', '.join(OPERAND_NAMES)}):"]
    for n, index in enumerate(lines):
        source.append(f"    t{n} = {call_text(index)}")
        source.append(f"    del t{n}")
    source.append("    return None")
    namespace: dict[str, Any] = {"aten": torch.ops.aten}
    exec(compile("\n".join(source) + "\n", "<peakcut mix program>", "exec"), namespace)
    return namespace["program"]
