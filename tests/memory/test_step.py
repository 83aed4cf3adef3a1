"""Memory simulation semantics, checked on captured graphs and against a brute-force model."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import peakcut
from peakcut.memory import simulate, tensor_lifetimes


def _brute_force_peak(g, order) -> int:
    """Per step: caller-held + every storage created at or before i and read at or after i."""
    held = g.caller_held_storages()
    outs = g.output_storages()
    created: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, nid in enumerate(order):
        for t in g.nodes[nid].output_ids():
            s = g.tensors[t].storage
            if s not in held:
                created.setdefault(s, i)
                last.setdefault(s, i)
        for t in g.nodes[nid].input_ids():
            s = g.tensors[t].storage
            if s in created:
                last[s] = max(last[s], i)
    base = sum(g.storages[s] for s in held)
    peak = 0
    for i in range(len(order)):
        live = sum(g.storages[s] for s, c in created.items()
                   if c <= i <= (len(order) - 1 if s in outs else last[s]))
        peak = max(peak, base + live)
    return peak


class Chain(nn.Module):
    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x)).t().contiguous().t()  # views and a copy per layer
        return x


@settings(max_examples=15, deadline=None)
@given(widths=st.lists(st.integers(1, 12), min_size=2, max_size=5), batch=st.integers(1, 6),
       optimizer=st.sampled_from(["sgd", "adamw", None]))
def test_simulation_matches_brute_force(widths, batch, optimizer):
    model = Chain(widths)
    data = (torch.randn(batch, widths[0]),)
    g = peakcut.capture(model, data, lambda m, b: m(b[0]).square().mean(), optimizer)
    prof = simulate(g, workspace=None)
    assert prof.peak_bytes == _brute_force_peak(g, g.order)
    assert prof.peak_bytes == int(prof.timeline.max())


def test_caller_held_and_views(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, lambda m, b: m(b[0]).sum(), "sgd")
    prof = simulate(g, workspace=None)
    params = sum(p.numel() * 4 for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    state = params  # one momentum buffer per parameter
    data = sum(t.numel() * t.element_size() for t in batch)
    assert prof.baseline_bytes == params + buffers + state + data
    assert min(prof.timeline) >= prof.baseline_bytes
    # views add no storage: every view op output shares its input's storage
    for n in g.nodes.values():
        if n.op in ("aten.view.default", "aten.t.default", "aten.permute.default"):
            (src,) = [t for t in n.input_ids()]
            assert g.tensors[n.outputs[0]].storage == g.tensors[src].storage


def test_inplace_updates_do_not_allocate(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, lambda m, b: m(b[0]).sum(), "adamw")
    inplace = [nid for nid, n in g.nodes.items() if n.op.split(".")[1].endswith("_")]
    assert len(inplace) > 10
    for nid in inplace:
        written = {g.tensors[t].storage for t in g.mutated_tensors(nid)}
        assert written and {g.tensors[t].storage for t in g.nodes[nid].output_ids()} <= written
    owners = g.storage_owner()
    assert not any(owners.get(s) in inplace for s in owners)  # an in-place op never allocates a storage


def test_lifetimes_and_hotspots(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, lambda m, b: m(b[0]).sum(), "sgd")
    life = tensor_lifetimes(g, g.order)
    for t in g.outputs:
        assert life[t][1] == len(g.order)
    prof = simulate(g)
    assert prof.hotspots and sum(h.bytes for h in prof.hotspots) <= prof.peak_bytes
    assert prof.hotspots_by_module()[0][1] >= prof.hotspots_by_module()[-1][1]
