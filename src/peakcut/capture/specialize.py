"""Data-dependent sizes, specialised on the values seen at capture.

A boolean mask indexing a tensor (``out[train_mask]``), ``torch.nonzero`` and
``masked_select`` have results whose size depends on tensor values, which FakeTensors do
not have. When the trace meets one, capture runs the loss once eagerly on the real batch
(no gradients, the random generator and the buffers left as they were) and records, in
order, how many elements each such call selects. The trace is then made again with those
calls decomposed: each boolean operand becomes ``peakcut::nonzero_counted(mask, count)``
(``peakcut.ir.guards``), whose rows index the tensor as the mask did. The graph's shapes are
those of the capture batch, and at run time the guard raises ``SpecializationError`` when a
batch selects another number of elements; ``Plan.step`` then plans that batch again.

In the forward and the loss, calls take the recorded counts in order; the backward's calls
(the gradient of a boolean index is an ``index_put`` with the same mask) find the count of
their mask, the very tensor the forward indexed with. A batch without values (the meta
device) cannot be specialised: capture raises a CaptureError naming the op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from peakcut.capture.errors import CaptureError
from peakcut.capture.module_state import tensors_restored
from peakcut.capture.trace import TraceLog
from peakcut.ir import guards  # noqa: F401  (registers peakcut::nonzero_counted)
from peakcut.ir.node import Phase

aten = torch.ops.aten
_INDEX_OPS = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
SPECIALISED_OPS = (aten.nonzero.default, aten.masked_select.default, *_INDEX_OPS)
"""The ops whose sizes capture specialises: nonzero, masked_select, indexing with a boolean mask."""
HINT = ("write the selection without a data-dependent size: a mask-weighted loss, "
        "(loss_per_row * mask).sum() / mask.sum(), or integer indices (out[train_idx])")


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def masks_of(func: Any, args: Sequence[Any]) -> list[torch.Tensor] | None:
    """The operands of a call whose nonzero elements decide its size (None: the call has none)."""
    if func is aten.nonzero.default:
        return [args[0]]
    if func is aten.masked_select.default:
        shape = torch.broadcast_shapes(args[0].shape, args[1].shape)
        return [args[1].expand(shape)]
    if func in _INDEX_OPS:
        found = [i for i in args[1] if _is_mask(i)]
        return found or None
    return None


class _Recorder(TorchDispatchMode):
    """Records each specialised call's op and its masks' nonzero counts, in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        masks = masks_of(func, args) if func in SPECIALISED_OPS else None
        if masks is not None:
            self.calls.append((str(func), tuple(int(m.count_nonzero()) for m in masks)))
        return func(*args, **(kwargs or {}))


def record_counts(model: torch.nn.Module, batch: Any, loss_fn: Callable[[Any, Any], Any] | None,
                  cause: BaseException) -> list[tuple[str, tuple[int, ...]]]:
    """Run the loss (inference: the model) once on the real batch and record the specialised
    calls; `cause` is the trace's error, named when the batch or model has no values."""
    leaves = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    tensors = [*leaves, *model.parameters(), *model.buffers()]
    if any(t.device.type == "meta" for t in tensors):
        raise CaptureError(f"{cause}; peakcut specialises such a size on the values it sees at capture, but "
                           f"the batch or the model is on the meta device (no values): capture with real "
                           f"tensors, or {HINT}") from cause
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    recorder = _Recorder()
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        stack.enter_context(torch.no_grad())
        stack.enter_context(tensors_restored(model))
        stack.enter_context(_reparametrize_module(model, buffers, strict=False))
        stack.enter_context(recorder)
        if loss_fn is None:
            model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
        else:
            loss_fn(model, batch)
    if not recorder.calls:      # another data-dependent op (unique, ...): the trace's own error
        raise cause
    return recorder.calls


@dataclass
class Specializer:
    """The recorded counts, handed to the trace as decompositions of the specialised ops."""

    calls: list[tuple[str, tuple[int, ...]]]
    log: TraceLog | None = None
    _next: int = 0
    _seen: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """What capture specialised, for the user."""
        shown = ", ".join(f"{op} selecting {'/'.join(map(str, counts))}" for op, counts in self.calls[:4])
        more = f" and {len(self.calls) - 4} more" if len(self.calls) > 4 else ""
        return [f"data-dependent sizes specialised on the capture batch's values ({shown}{more}); a batch "
                "selecting other counts is planned again (Plan.step) or refused (SpecializationError)"]

    def decompositions(self, log: TraceLog) -> dict[Any, Callable[..., Any]]:
        """The decomposition table entries that specialise each op (for make_fx)."""
        self.log, self._next = log, 0
        self._seen.clear()
        table: dict[Any, Callable[..., Any]] = {
            aten.nonzero.default: self._nonzero, aten.masked_select.default: self._masked_select}
        for op in _INDEX_OPS:
            table[op] = self._indexed(op)
        return table

    def _counts(self, op: str, masks: list[torch.Tensor]) -> list[int]:
        phase = self.log.phase if self.log is not None else Phase.FORWARD
        if phase in (Phase.BACKWARD, Phase.OPTIMIZER):
            hits = [self._seen.get(id(m)) for m in masks]
            if all(h is not None and h[0] is m for h, m in zip(hits, masks, strict=True)):
                return [h[1] for h in hits if h is not None]
            raise CaptureError(f"{op} with a data-dependent size in the {phase.value} on a mask the forward did "
                               f"not index with: peakcut cannot specialise it; {HINT}")
        if self._next >= len(self.calls) or self.calls[self._next][0] != op \
                or len(self.calls[self._next][1]) != len(masks):
            seen = self.calls[self._next][0] if self._next < len(self.calls) else "nothing more"
            raise CaptureError(f"{op}: the traced step and the eager run at capture disagree on the data-dependent "
                               f"calls (call {self._next}: the eager run made {seen}); {HINT}")
        counts = list(self.calls[self._next][1])
        self._next += 1
        for m, c in zip(masks, counts, strict=True):
            self._seen[id(m)] = (m, c)
        return counts

    def _rows(self, op: str, mask: torch.Tensor, count: int) -> torch.Tensor:
        return torch.ops.peakcut.nonzero_counted(mask, count, op)

    def _nonzero(self, x: torch.Tensor) -> torch.Tensor:
        op = str(aten.nonzero.default)
        return self._rows(op, x, self._counts(op, [x])[0])

    def _masked_select(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        op = str(aten.masked_select.default)
        shape = torch.broadcast_shapes(x.shape, mask.shape)
        wide = mask.expand(shape)
        rows = self._rows(op, wide, self._counts(op, [wide])[0])
        return aten.index.Tensor(x.expand(shape), list(rows.unbind(1)))

    def _indexed(self, func: Any) -> Callable[..., Any]:
        op = str(func)

        def decomposed(x: torch.Tensor, indices: Sequence[Any], *rest: Any, **kwargs: Any) -> Any:
            masks = [i for i in indices if _is_mask(i)]
            if not masks:
                return NotImplemented
            counts = iter(self._counts(op, masks))
            longs: list[Any] = []
            for i in indices:
                if _is_mask(i):
                    longs.extend(self._rows(op, i, next(counts)).unbind(1))
                else:
                    longs.append(i)
            return func(x, longs, *rest, **kwargs)

        return decomposed
