"""Analytic cost model: every profile prices small (fission-sized) ops higher per unit of work,
is positive and monotone, prices swaps as launch + bytes / host bandwidth and views as a
constant."""

from __future__ import annotations

import pytest
import torch

from peakcut.cost import PROFILE_NAMES, AnalyticCostModel, get_cost_model, get_profile
from peakcut.cost.calls import call_key, node_work
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, STORE_OP
from tests.cost.graphs import (
    NODE,
    add_graph,
    conv_graph,
    mm_graph,
    one_op_graph,
    swap_graph,
    view_graph,
)

FISSION_PARTS = (8, 32)


def _per_unit(cost: AnalyticCostModel, g: Graph) -> tuple[float, float]:
    """Seconds per FLOP and per byte moved of the graph's node."""
    work = node_work(g, NODE)
    seconds = cost.node_seconds(g, NODE)
    return seconds / work.flops, seconds / work.bytes


@pytest.fixture(params=PROFILE_NAMES)
def cost(request: pytest.FixtureRequest) -> AnalyticCostModel:
    return get_cost_model(request.param)


@pytest.mark.parametrize("parts", FISSION_PARTS)
def test_fission_slices_cost_more_per_flop(cost: AnalyticCostModel, parts: int) -> None:
    """Slicing mm rows / conv batch / element-wise elements into `parts`: each slice costs more
    per FLOP, and the slices together cost more than the whole op."""
    cases = [
        ("mm", mm_graph(4096, 1024, 1024), mm_graph(4096 // parts, 1024, 1024)),
        ("conv", conv_graph(64), conv_graph(64 // parts)),
        ("add", add_graph(1 << 24), add_graph((1 << 24) // parts)),
    ]
    for label, whole, piece in cases:
        assert _per_unit(cost, piece)[0] > _per_unit(cost, whole)[0], \
            f"{cost.name} {label}: slice 1/{parts} per FLOP"
        assert parts * cost.node_seconds(piece, NODE) > cost.node_seconds(whole, NODE)


@pytest.mark.parametrize("parts", FISSION_PARTS)
def test_fission_slices_cost_more_per_byte(cost: AnalyticCostModel, parts: int) -> None:
    """Per byte moved, for slices whose bytes shrink with them: element-wise ops, and mm / conv
    sliced along every operand (a row slice of mm still reads the whole weight, and
    compute-bound work rightly gets cheaper per byte)."""
    cases = [
        ("add", add_graph(1 << 24), add_graph((1 << 24) // parts)),
        ("mm", mm_graph(64, 64, 1 << 16), mm_graph(64, 64, (1 << 16) // parts)),
        ("conv", conv_graph(64, channels=1), conv_graph(64 // parts, channels=1)),
    ]
    for label, whole, piece in cases:
        assert _per_unit(cost, piece)[1] > _per_unit(cost, whole)[1], \
            f"{cost.name} {label}: slice 1/{parts} per byte"


def test_latency_positive_and_monotone_in_size(cost: AnalyticCostModel) -> None:
    for build in (lambda s: mm_graph(s, s, s), lambda s: add_graph(s * s * 16),
                  lambda s: conv_graph(max(1, s // 16), size=max(4, s // 8))):
        seconds = [cost.node_seconds(build(s), NODE) for s in (16, 64, 256, 1024, 4096)]
        assert all(t > 0 for t in seconds)
        assert seconds == sorted(seconds), f"{cost.name}: {seconds}"
        assert seconds[-1] > seconds[0]


@pytest.mark.parametrize("op,direction", [(STORE_OP, "d2h"), (LOAD_OP, "h2d")])
def test_swap_costs_launch_plus_bytes_over_host_bandwidth(cost: AnalyticCostModel, op: str,
                                                          direction: str) -> None:
    profile = cost.profile
    for numel in (1, 1 << 10, 1 << 24):
        g = swap_graph(op, numel)
        expected = profile.launch_seconds + 4 * numel / profile.host_bandwidth(direction)
        # a GPU issues the copy (its launch) on the host and runs the transfer on a copy engine
        assert cost.issue_seconds(g, NODE) == pytest.approx(profile.launch_seconds if profile.asynchronous else 0.0)
        assert cost.node_seconds(g, NODE) + cost.issue_seconds(g, NODE) == pytest.approx(expected)
        assert cost.copy_seconds(4 * numel, direction) == pytest.approx(expected)


def test_views_cost_a_constant(cost: AnalyticCostModel) -> None:
    small, large = view_graph(64), view_graph(1 << 26)
    host, device = (cost.profile.view_seconds, 0.0) if cost.profile.asynchronous else (0.0, cost.profile.view_seconds)
    assert cost.issue_seconds(small, NODE) == cost.issue_seconds(large, NODE) == host
    assert cost.node_seconds(small, NODE) == cost.node_seconds(large, NODE) == device   # a GPU runs no kernel
    assert cost.profile.view_seconds < cost.issue_seconds(add_graph(64), NODE) + cost.node_seconds(add_graph(64), NODE)


def test_a_gpu_issues_calls_on_the_host_and_a_cpu_runs_them() -> None:
    """On a GPU profile a call's launch is issue time and the rest device time; on the CPU the
    call's whole time is node_seconds."""
    gpu, cpu = get_cost_model("h100"), get_cost_model("cpu", cpu_threads=2)
    g = add_graph(1 << 20)
    assert gpu.issue_seconds(g, NODE) == gpu.profile.launch_seconds
    work = node_work(g, NODE)
    assert gpu.node_seconds(g, NODE) == pytest.approx(gpu.work_seconds(work) - gpu.profile.launch_seconds)
    assert cpu.issue_seconds(g, NODE) == 0.0
    assert cpu.node_seconds(g, NODE) == pytest.approx(cpu.work_seconds(work))


def test_copy_direction_is_checked(cost: AnalyticCostModel) -> None:
    with pytest.raises(ValueError, match="sideways"):
        cost.copy_seconds(16, "sideways")


@pytest.mark.parametrize("name", ["rtx3090", "a100-80gb", "h100", "h200"])
def test_gpu_tensor_cores(name: str) -> None:
    fp32, tf32 = get_cost_model(name), get_cost_model(name, tf32=True)
    big = mm_graph(4096, 4096, 4096)
    if name == "rtx3090":  # GeForce: dense TF32 tensor rate = FP32 rate (35.6 TFLOPS)
        assert tf32.node_seconds(big, NODE) == fp32.node_seconds(big, NODE)
    else:
        assert tf32.node_seconds(big, NODE) < fp32.node_seconds(big, NODE)
    bf16 = mm_graph(4096, 4096, 4096, dtype=torch.bfloat16)
    assert fp32.node_seconds(bf16, NODE) < fp32.node_seconds(big, NODE)
    assert fp32.overlap_copies and fp32.name == f"analytic:{name}"


def test_big_matmul_rate_matches_the_datasheet() -> None:
    """A 16k^3 BF16 GEMM on an H100 runs close to (below) the 989.5 TFLOPS dense peak."""
    cost = get_cost_model("h100")
    g = mm_graph(16384, 16384, 16384, dtype=torch.bfloat16)
    rate = node_work(g, NODE).flops / cost.node_seconds(g, NODE)
    assert 0.9 * 989.5e12 < rate < 989.5e12


def test_cpu_profile_follows_threads() -> None:
    one, four = get_profile("cpu", cpu_threads=1), get_profile("cpu", cpu_threads=4)
    assert four.memory_bandwidth == 4 * one.memory_bandwidth
    assert not get_cost_model("cpu").overlap_copies
    with pytest.raises(ValueError, match="threads"):
        get_profile("cpu", cpu_threads=0)


def test_per_key_cache_lives_in_the_instance() -> None:
    a, b = get_cost_model("h200"), get_cost_model("h200")
    g = mm_graph(64, 64, 64)
    a.node_seconds(g, NODE)
    assert call_key(g, NODE) in a._seconds and not b._seconds


def test_an_overwriting_copy_reads_only_its_source() -> None:
    """copy_ writes its destination without reading it: two tensors' bytes move, where add_
    (which reads it) moves three (split_rows writes a part's gradient rows with copy_)."""
    x = torch.empty(64, 256, device="meta")
    nbytes = x.numel() * x.element_size()
    assert node_work(one_op_graph("aten.copy_.default", x, torch.empty_like(x)), NODE).bytes == 2 * nbytes
    assert node_work(one_op_graph("aten.add_.Tensor", x, torch.empty_like(x)), NODE).bytes == 3 * nbytes
    assert node_work(one_op_graph("aten.zero_.default", x), NODE).bytes == nbytes
