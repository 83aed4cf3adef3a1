"""A generator state (peakcut.rng_state) is a host tensor on an accelerator: not device memory."""

from __future__ import annotations

import json

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import peakcut
from peakcut.ir.ops import RNG_STATE_OP
from peakcut.ir.serialize import graph_from_json, graph_to_json


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda h: self.drop(self.fc(h)), self.fc(x), use_reentrant=False)


def test_generator_states_are_host_storages_on_an_accelerator_only() -> None:
    g = peakcut.capture(Checkpointed(), (torch.randn(4, 8),), lambda m, b: m(b[0]).sum(), "adamw")
    states = {g.tensors[t].storage for n in g.nodes.values() if n.op == RNG_STATE_OP for t in n.output_tuple}
    assert states
    assert not states & g.host_storages()              # a CPU step: the state is in the memory it counts
    text = json.loads(graph_to_json(g))
    text["device"] = "cuda:0"
    on_gpu = graph_from_json(json.dumps(text))
    assert states <= on_gpu.host_storages()
