"""A step that fails after its update began says so (PartialUpdateError), never silently.

The capture orders every write of a parameter or of optimizer state after the loss
(capture.control_edges.updates_after_loss), so a batch that fails in the forward or the loss
leaves them as they were. A schedule may still place part of an update before the backward ends: AdamW's weight
decay needs no gradient, an update on the host runs beside the backward, and an update right
after its gradient frees that gradient early. If the step then fails in the rest of the backward
(out of memory, say), some parameters or moments have changed and the user's loop, retrying the
batch, would apply those changes twice. Where a program has such a write, its source sets
`updates_begun = True` right before the first one, and Step reads that flag from the failed
frame: past it, the error is raised as PartialUpdateError (with the original as its cause), which
says to restore the model and optimizer before going on.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import CodeType, TracebackType

from peakcut.codegen.hooks import NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.tensor import Role

FLAG = "updates_begun"
"""The generated step's local that says a persistent write has been issued."""

_PERSISTENT = (Role.PARAM, Role.OPT_STATE, Role.ACCUMULATED)


class PartialUpdateError(RuntimeError):
    """The step failed after it began writing parameters or optimizer state: they are partly
    updated (restore them, e.g. from a checkpoint, before the next step). `__cause__` is the
    original error."""


def first_early_write(g: Graph, order: Sequence[int]) -> int | None:
    """The first node in `order` that writes a parameter or optimizer state (in place) while
    forward, loss or backward ops still follow it; None when every such write comes after them."""
    persistent = {g.tensors[t].storage for t in g.inputs if g.tensors[t].role in _PERSISTENT}
    last_device_pass = max((k for k, nid in enumerate(order) if g.nodes[nid].phase is not Phase.OPTIMIZER),
                           default=-1)
    for nid in order[:last_device_pass]:
        node = g.nodes[nid]
        if node.phase is Phase.OPTIMIZER and persistent & {g.tensors[t].storage for t in node.mutated_ids()}:
            return nid
    return None


class UpdateProgressCode(NodeCode):
    """Sets FLAG right before the first early write (module doc)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def prologue(self) -> list[str]:
        return [f"    {FLAG} = False  # set before the first write of a parameter or optimizer state "
                "that comes before the backward ends"]

    def before(self, nid: int, pad: str) -> list[str]:
        if nid != self.first:
            return []
        return [f"{pad}{FLAG} = True  # from here a failure leaves parameters or optimizer state partly "
                "updated (PartialUpdateError)"]


def update_begun(code: CodeType, tb: TracebackType | None) -> bool:
    """Whether the frame of `code` (the generated step) in traceback `tb` had set FLAG."""
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return bool(tb.tb_frame.f_locals.get(FLAG, False))
        tb = tb.tb_next
    return False
