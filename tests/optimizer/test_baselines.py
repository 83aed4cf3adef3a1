"""The ZeRO-Offload-style peer (optimizer.baselines): host_update at every parameter, nothing else,
simulated on the same timeline as peakcut's plans, and in the optimize report on GPU profiles."""

from __future__ import annotations

import torch

import peakcut
from peakcut.cost.model import get_cost_model
from peakcut.ir.tensor import Role
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.baselines import ZERO_OFFLOAD, zero_offload
from peakcut.simulate import simulate_timeline
from peakcut.workloads import get_workload


def test_zero_offload_moves_every_update_and_the_moments_off_the_device() -> None:
    inst = get_workload("llama2-7b").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    cost = get_cost_model("h100")
    eager = simulate_timeline(g, g.order, cost)
    peer = zero_offload(g, cost)
    params = [t for t in g.inputs if g.tensors[t].role is Role.PARAM]
    moments = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is Role.OPT_STATE)
    assert peer.name == ZERO_OFFLOAD and peer.host_updated == len(params) and not peer.refused
    assert peer.peak_bytes <= eager.peak_bytes - moments
    assert "simulated" in peer.method and "analytic:h100" in peer.method


def test_the_optimize_report_prices_the_peer_on_gpu_profiles_only() -> None:
    inst = get_workload("gpt2-xl").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, torch.optim.AdamW(inst.model.parameters()))
    on_gpu = optimize_graph(g, memory_limit=0.5, device="h100", time_budget=5, max_states=5)
    assert on_gpu.report["zero_offload"]["host_updated"] > 0
    on_cpu = optimize_graph(g, memory_limit=0.5, device="cpu", time_budget=5, max_states=5)
    assert on_cpu.report["zero_offload"] is None
