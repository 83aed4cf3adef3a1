"""Control edges capture adds to the step it traced: random draws keep their order, every
update of a parameter or of optimizer state runs after the loss and after every guard of a
specialised size, and a GradScaler's gate runs between what the step returns and the updates
it may skip."""

from __future__ import annotations

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.guards import NONZERO_COUNTED_OP
from peakcut.ir.node import Phase
from peakcut.ir.ops import GATE_OP
from peakcut.ir.registry import draws_random


def chain_random(edit: GraphEditor) -> None:
    """Calls that draw random numbers keep their capture order (control edges between them), so
    any schedule draws the same masks from the generator as the eager step (docs/design.md:
    randomness)."""
    g = edit.graph
    last: int | None = None
    for nid in g.order:
        node = g.nodes[nid]
        if draws_random(node.op, node.args, node.kwargs):
            if last is not None:
                edit.add_control(nid, [last])
            last = nid


def _input_storages(g: Graph, prefixes: tuple[str, ...]) -> set[int]:
    """Storages of the step's inputs whose names start with one of `prefixes`."""
    return {g.tensors[t].storage for t, name in zip(g.inputs, g.input_names, strict=True)
            if name.startswith(prefixes)}


def gate_updates(edit: GraphEditor) -> None:
    """The GradScaler's gate (an early return when found_inf) runs after everything the step
    returns or must do whatever it finds (the outputs, buffer updates), and every write of a
    parameter or of optimizer state runs after it."""
    g = edit.graph
    gates = [n.id for n in g.nodes.values() if n.op == GATE_OP]
    if not gates:
        return
    gate = gates[0]
    owned = _input_storages(g, ("param:", "state:"))
    buffers = _input_storages(g, ("buffer:", "const:"))
    for t in g.outputs:
        producer = g.producer(t)
        if producer is not None and producer != gate:
            edit.add_control(gate, [producer])
    for node in list(g.nodes.values()):
        if node.id == gate:
            continue
        written = {g.tensors[t].storage for t in node.mutated_ids()}
        if node.phase is Phase.OPTIMIZER and written & owned:
            edit.add_control(node.id, [gate])
        elif written & buffers:
            edit.add_control(gate, [node.id])


def updates_after_loss(edit: GraphEditor) -> None:
    """Every write of a parameter or of optimizer state runs after the loss, as in the eager
    loop: a step that fails on its batch (a label out of range, a NaN check in the model)
    then leaves the model and optimizer untouched. Without these edges a schedule may hoist
    the parts of an update that need no gradient (AdamW's weight decay, beta2 * exp_avg_sq)
    into the forward; those writes are in place, so the order costs no memory."""
    g = edit.graph
    loss = g.producer(g.outputs[0]) if g.outputs and g.output_names[0] == "loss" else None
    if loss is None:
        return
    owned = _input_storages(g, ("param:", "state:"))
    for node in list(g.nodes.values()):
        if node.phase is Phase.OPTIMIZER and node.id != loss and owned & {
                g.tensors[t].storage for t in node.mutated_ids()}:
            edit.set_control(node.id, sorted({*g.control.get(node.id, ()), loss}))   # ids ascending, as capture's


def updates_after_guards(edit: GraphEditor) -> None:
    """Every write of a parameter or of optimizer state runs after every guard of a size capture
    specialised (peakcut::nonzero_counted): a batch whose counts differ then fails before the
    update changes anything, and Plan.step can plan it again."""
    g = edit.graph
    guards = [n.id for n in g.nodes.values() if n.op == NONZERO_COUNTED_OP]
    if not guards:
        return
    owned = _input_storages(g, ("param:", "state:", "acc:"))
    for node in list(g.nodes.values()):
        if node.phase is Phase.OPTIMIZER and owned & {g.tensors[t].storage for t in node.mutated_ids()}:
            edit.set_control(node.id, sorted({*g.control.get(node.id, ()), *guards}))
