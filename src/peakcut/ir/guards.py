"""Data-dependent sizes specialised at capture, and the guard that checks them at run time.

`peakcut::nonzero_counted(x, count)` is `torch.nonzero(x)` whose number of rows capture saw
(`count`); the captured step is shaped by that count (a boolean mask's selection, an index
built from a comparison). At run time it computes the nonzero indices and raises
`SpecializationError` when their number differs from `count`, naming the op and both counts,
so a step never runs on with shapes its plan was not made for (`Plan.step` plans again).
"""

from __future__ import annotations

import torch

NONZERO_COUNTED_OP = "peakcut.nonzero_counted.default"


class SpecializationError(RuntimeError):
    """A size the captured step was specialised to (a count of nonzero elements) differs at run time."""

    def __init__(self, op: str, captured: int, found: int) -> None:
        super().__init__(f"{op}: the captured step is specialised to {captured} nonzero elements "
                         f"(the values seen at capture), this batch has {found}")
        self.op, self.captured, self.found = op, captured, found


@torch.library.custom_op("peakcut::nonzero_counted", mutates_args=())
def nonzero_counted(x: torch.Tensor, count: int, op: str) -> torch.Tensor:
    """torch.nonzero(x), which must have `count` rows (else SpecializationError naming `op`,
    the user's op that needed the count)."""
    out = torch.nonzero(x)
    if out.shape[0] != count:
        raise SpecializationError(op, count, int(out.shape[0]))
    return out


@nonzero_counted.register_fake
def _nonzero_counted_fake(x: torch.Tensor, count: int, op: str) -> torch.Tensor:
    return x.new_empty((count, x.dim()), dtype=torch.int64)
