"""The workspace model's machine seam and caches: explicit keys, thread count included, lazy op list."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.memory.workspace import (
    CpuMachine,
    CpuWorkspace,
    OneDnnFit,
    cpu_workspace_bytes,
    node_workspace,
    order_workspace,
    workspace_model,
)

aten = torch.ops.aten


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.ln(x))


@pytest.fixture(scope="module")
def graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(Norm(), (torch.randn(4, 16, 64),), lambda m, b: m(b[0]).square().mean(), "sgd")


def _threads(n: int) -> CpuWorkspace:
    return CpuWorkspace(dataclasses.replace(CpuMachine.current(), threads=n))


def test_the_op_list_is_not_built_at_import() -> None:
    code = ("import peakcut, peakcut.memory.workspace as w; "
            "print(w.workspace_ops.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_thread_count_is_part_of_the_cache_key(graph: Graph) -> None:
    """layer_norm_backward keeps per-thread partials: each machine gets its own values, even on
    a graph whose cache was filled for another thread count (forked search workers)."""
    g = graph.copy()
    backward = next(nid for nid in g.order if g.nodes[nid].op == "aten.native_layer_norm_backward.default")
    one = node_workspace(g, backward, _threads(1))
    two = node_workspace(g, backward, _threads(2))
    assert two - one == 2 * 64 * 4          # 2 * threads * normalized numel * itemsize
    assert set(g.workspace_cache) == {_threads(1).key, _threads(2).key}
    assert order_workspace(g, g.order, _threads(1)).sum() < order_workspace(g, g.order, _threads(2)).sum()
    copied = g.copy()                        # the per-graph cache travels with copies, per machine
    assert copied.workspace_cache == g.workspace_cache
    assert copied.workspace_cache[_threads(1).key] is not g.workspace_cache[_threads(1).key]


def test_cpu_means_this_process_threads(graph: Graph) -> None:
    g = graph.copy()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = simulate(g, workspace="cpu").workspace.sum()
        torch.set_num_threads(2)
        two = simulate(g, workspace="cpu").workspace.sum()
    finally:
        torch.set_num_threads(before)
    assert (one, two) == (order_workspace(g, g.order, _threads(1)).sum(),
                          order_workspace(g, g.order, _threads(2)).sum())
    assert one < two


def test_a_replaced_node_is_computed_again(graph: Graph) -> None:
    g = graph.copy()
    nid = next(nid for nid in g.order if g.nodes[nid].op == "aten.native_layer_norm_backward.default")
    model = _threads(2)
    before = node_workspace(g, nid, model)
    node = g.nodes[nid]
    masked = list(node.args)
    masked[-1] = [True, False, False]        # no grad_weight / grad_bias: no partials
    edit = GraphEditor(g)
    edit.replace_node(dataclasses.replace(node, args=tuple(masked)))
    g = edit.finish()
    assert node_workspace(g, nid, model) == before - 2 * 2 * 64 * 4


def test_a_calibrated_fit_changes_the_values() -> None:
    """The seam: a machine with another OneDnnFit gives the rules its own byte counts."""
    a = torch.empty(128, 256, dtype=torch.bfloat16, device="meta")
    b = torch.empty(256, 512, dtype=torch.bfloat16, device="meta")
    out = torch.empty(128, 512, dtype=torch.bfloat16, device="meta")
    machine = dataclasses.replace(CpuMachine.current(), threads=2)
    fitted = dataclasses.replace(machine, fit=OneDnnFit(matmul_scratch_base=384 + 1000))
    base = cpu_workspace_bytes(aten.mm.default, (a, b), {}, [out], machine)
    assert base > 0
    assert cpu_workspace_bytes(aten.mm.default, (a, b), {}, [out], fitted) == base + 1000


def test_unknown_model_is_refused(graph: Graph) -> None:
    with pytest.raises(ValueError, match="unknown workspace model 'gpu'"):
        workspace_model("gpu")
    assert workspace_model(None) is None
    model = _threads(3)
    assert workspace_model(model) is model
    assert not order_workspace(graph, graph.order, None).any()
