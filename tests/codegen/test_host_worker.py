"""The host stream's worker (codegen.host_worker): an op's error is raised by the join of its
own step, never lost and never raised by the next step's join, however the worker thread and
the step's thread interleave."""

from __future__ import annotations

import sys

import pytest
import torch

from peakcut.codegen.host_worker import HostWorker


def _same(x: int) -> int:
    return x


def _fails(x: int) -> torch.Tensor:
    """An aten op that fails on its shapes (raised from C++, after some work: the race needs it)."""
    try:
        return torch.ops.aten.add.Tensor(torch.ones(2), torch.ones(3))
    except RuntimeError as e:
        raise RuntimeError(f"op failed on {x}") from e


@pytest.fixture
def fast_switching():
    """Thread switches as often as the interpreter allows (the race needs the done callback to
    run after join has woken up)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_the_last_ops_error_is_raised_by_its_own_join(fast_switching) -> None:
    worker = HostWorker(threaded=True)
    for step in range(5000):        # (the old join lost an error within a few hundred steps)
        worker.run(_fails, step)
        with pytest.raises(RuntimeError, match=f"op failed on {step}$"):
            worker.join()
    worker.run(_same, 0)
    worker.join()       # no failure above is raised again


def test_the_first_error_in_submission_order_wins_and_discard_forgets_it() -> None:
    worker = HostWorker(threaded=True)
    for x in range(5):
        worker.run(_fails, x)
    with pytest.raises(RuntimeError, match="op failed on 0$"):
        worker.join()
    worker.run(_fails, 9)
    worker.discard()
    worker.run(_same, 1)
    worker.join()
