"""The simulated peak of a foreach or fused update against the measured one.

torch.optim's foreach Adam holds the square root of every exp_avg_sq at once; capture
records that list op as one node per tensor in the list op's order, so liveness counts those
temporaries together. The step's peak is then measured on this CPU from the allocator's
profiler events (peakcut.measure, method "cpu-profiler") while the generated program (with
its torch._foreach_* calls) runs: the simulation (peakcut.memory.simulate, the CPU workspace
model) gives the same bytes, as the spine test (tests/runtime/test_memory_agreement.py)
finds for the single-tensor update.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.foreach import ForeachTag
from peakcut.memory import simulate

# parameters far larger than the activations (batch 2): the update's temporaries matter
WIDTHS = (128, 256, 256, 8)


def make() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def loss_fn(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


BATCH = (torch.randn(2, WIDTHS[0], generator=torch.Generator().manual_seed(1)), torch.tensor([1, 3]))


@pytest.mark.parametrize("how", ["foreach", "fused"])
def test_simulated_peak_of_a_list_update_is_the_measured_one(how: str) -> None:
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{how: True})
    g = peakcut.capture(model, BATCH, loss_fn, opt)
    assert any(n.tags.get(ForeachTag) for n in g.nodes.values())
    measured = peakcut.measure(peakcut.build(g, optimizer=opt), model, BATCH, method="cpu-profiler", repeats=1)
    assert simulate(g).peak_bytes == measured.peak_bytes


def test_list_wide_temporaries_are_alive_together() -> None:
    """When the foreach sqrt's last share runs, every exp_avg_sq's root is alive (the list op
    holds them all until the update's last op), and their bytes are the parameters'."""
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = peakcut.capture(model, BATCH, loss_fn, opt)
    prof = simulate(g)
    sqrt = [i for i, nid in enumerate(prof.order)
            if (t := g.nodes[nid].tags.get(ForeachTag)) is not None and t.op == "_foreach_sqrt"]
    assert len(sqrt) == len(list(model.parameters()))
    roots = [g.tensors[g.nodes[prof.order[i]].output_ids()[0]].storage for i in sqrt]
    assert all(prof.storage_lifetime[s][0] <= sqrt[-1] < prof.storage_lifetime[s][1] for s in roots)
    assert sum(g.storages[s] for s in roots) == sum(p.numel() * p.element_size() for p in model.parameters())
