"""A step that fails after its schedule began the update raises PartialUpdateError, never
silently (codegen.update_progress): the capture order puts every write of a parameter or of
optimizer state after the backward, so its program has no marker; updates on the host placed
early (as the search places them) begin during the backward, and a failure there (an
out-of-memory injected into the last backward matmul) is raised as PartialUpdateError
with the original as its cause. A failure before the first write is raised as it is, with
parameters and optimizer state unchanged."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import peakcut
from peakcut.codegen.update_progress import FLAG, PartialUpdateError, first_early_write
from peakcut.cost.model import get_cost_model
from peakcut.rules import RULES
from peakcut.schedule.placement import place
from tests.helpers import cross_entropy_loss, make_mlp
from tests.rules.test_host_update import on_host


@contextmanager
def failing(step: peakcut.Step, op: str, call: int) -> Iterator[None]:
    """The generated step's `call`-th call of aten.<op>.default raises torch.OutOfMemoryError."""
    globals_ = step._fn.__globals__
    real = globals_["aten"]
    calls = [0]

    def fails(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == call:
            raise torch.OutOfMemoryError("injected out-of-memory")
        return getattr(real, op).default(*args, **kwargs)

    class Aten:
        def __getattr__(self, name: str) -> Any:
            return type("Op", (), {"default": staticmethod(fails)})() if name == op else getattr(real, name)

    globals_["aten"] = Aten()
    try:
        yield
    finally:
        globals_["aten"] = real


def early_update():
    model, batch = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    g = peakcut.capture(model, batch, cross_entropy_loss, opt)
    g, order = on_host(g, list(g.order))
    order = place(g, order, get_cost_model("h100"), placements=RULES.placements(g))
    return model, batch, opt, g, order


def test_the_capture_order_updates_after_the_backward_and_has_no_marker() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    assert first_early_write(g, g.order) is None
    assert FLAG not in peakcut.build(g).source


def test_a_failure_after_the_first_early_write_is_a_partial_update() -> None:
    model, batch, opt, g, order = early_update()
    assert first_early_write(g, order) is not None
    step = peakcut.build(g, order, optimizer=opt)
    assert f"{FLAG} = True" in step.source
    last_backward_mm = step.source.count("aten.mm.default")
    with failing(step, "mm", last_backward_mm), pytest.raises(PartialUpdateError, match="partly updated") as caught:
        step(model, batch)
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)


def test_a_failure_before_it_is_raised_as_it_is_and_changes_nothing() -> None:
    model, batch, opt, g, order = early_update()
    step = peakcut.build(g, order, optimizer=opt)
    step(model, batch)          # the optimizer has state now
    params = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(opt.state_dict())
    assert step.source.index("aten.addmm.default") < step.source.index(f"{FLAG} = True")
    with failing(step, "addmm", 1), pytest.raises(torch.OutOfMemoryError):     # in the forward
        step(model, batch)
    for name, value in model.state_dict().items():
        assert torch.equal(value, params[name]), name
    for i, slots in opt.state_dict()["state"].items():
        for slot, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state["state"][i][slot])), (i, slot)
