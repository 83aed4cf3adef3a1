"""Capture a training step whose loss and gradients come from the caller's own function.

peakcut.capture differentiates the loss itself (torch.autograd over make_fx). When something
else already decides how the backward runs -- a compiler's partitioned forward/backward pair,
a hand-written backward -- capture_with_gradients traces that function instead and appends
peakcut's optimizer update (the same traced update peakcut.capture records), so the result is
a Graph like any captured step: simulate it, cost it, compare its peak with peakcut's plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from peakcut.capture.convert import fx_to_graph
from peakcut.capture.trace import TraceLog, new_fake_mode
from peakcut.capture.update import HyperTable, slot_like, substitute_hypers, traced_update
from peakcut.ir.graph import Graph, StepSignature
from peakcut.ir.node import Phase
from peakcut.ir.tensor import Role
from peakcut.spec.optimizers import OptimizerSpec

# (parameters, buffers, batch leaves) -> (scalar loss, one gradient or None per parameter)
GradientsFn = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]],
                       tuple[torch.Tensor, Sequence[torch.Tensor | None]]]


def capture_with_gradients(model: torch.nn.Module, batch: Any, gradients: GradientsFn,
                           optimizer: OptimizerSpec, *, device: str = "cpu") -> Graph:
    """One step: `gradients` on FakeTensors, then `optimizer`'s update, as a Graph.

    gradients(params, buffers, leaves) receives the model's parameters and buffers (in
    named_parameters / named_buffers order, duplicates removed) and the batch's tensors (pytree
    leaves) and returns the loss and one gradient (or None) per parameter. The update covers
    the parameters `optimizer`'s groups name (peakcut.capture.describe_optimizer gives the spec
    of a torch.optim optimizer); one without a gradient is skipped, as torch.optim does. The
    graph's inputs are 'param:', 'buffer:', 'state:<param>.<slot>' and 'batch:<i>' tensors, its
    one output the loss; the model's tensors may live on the meta device (nothing is allocated).
    Phases: the update's nodes are the optimizer's, all others forward (peakcut cannot tell
    the forward from the backward inside `gradients`); nodes carry no module path.
    """
    param_items = list(model.named_parameters(remove_duplicate=True))
    buffer_items = list(model.named_buffers(remove_duplicate=True))
    leaves, batch_spec = pytree.tree_flatten(batch)
    group_of = optimizer.group_of()
    updated = [n for n, _ in param_items if n in group_of]
    slot_names = [(n, slot) for n in updated for slot in optimizer.slots(optimizer.groups[group_of[n]])]
    hypers = HyperTable()
    log = TraceLog()

    def step(params: list[torch.Tensor], buffers: list[torch.Tensor], slots: list[torch.Tensor],
             batch_leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        loss, grads = gradients(params, buffers, batch_leaves)
        by_name = {n: p for (n, _), p in zip(param_items, params, strict=True)}
        got = {n: g for (n, _), g in zip(param_items, grads, strict=True) if g is not None}
        slot_map: dict[str, dict[str, torch.Tensor]] = {n: {} for n in updated}
        for (n, slot), t in zip(slot_names, slots, strict=True):
            slot_map[n][slot] = t
        log.set_phase(Phase.OPTIMIZER)
        with torch.no_grad():
            traced_update(optimizer, by_name, got, slot_map, hypers, log)
        return [loss]

    fake_mode = new_fake_mode()

    def fake(t: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    params = [fake(p) for _, p in param_items]
    buffers = [fake(b) for _, b in buffer_items]
    fake_leaves = [fake(t) for t in leaves]
    by_fake = {n: p for (n, _), p in zip(param_items, params, strict=True)}
    with fake_mode:
        slots = [slot_like(by_fake[n], slot) for n, slot in slot_names]
    gm = make_fx(step, tracing_mode="fake", decomposition_table={})(params, buffers, slots, fake_leaves)
    substitute_hypers(gm, hypers)
    input_names = (
        [f"param:{n}" for n, _ in param_items] + [f"buffer:{n}" for n, _ in buffer_items]
        + [f"state:{n}.{s}" for n, s in slot_names] + [f"batch:{i}" for i in range(len(leaves))]
    )
    roles = ([Role.PARAM] * len(params) + [Role.BUFFER] * len(buffers)
             + [Role.OPT_STATE] * len(slots) + [Role.INPUT] * len(fake_leaves))
    signature = StepSignature(batch_spec=pytree.treespec_dumps(batch_spec), optimizer=optimizer.to_dict())
    return fx_to_graph(gm, input_names, roles, ["loss"], [Role.ACTIVATION], [True], log, device,
                       signature)
