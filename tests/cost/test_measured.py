"""Measured cost model: profiles a captured graph, caches per fingerprint on disk, never trusts
a bad cache file silently, falls back to an estimate for calls that cannot run standalone."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import peakcut
from peakcut.cost import (
    SCHEMA_VERSION,
    CostModel,
    MeasuredCostModel,
    TimingSettings,
    default_cache_dir,
    get_cost_model,
    step_seconds,
)
from peakcut.cost.calls import call_key, is_swap
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, STORE_OP
from tests.conftest import cnn_loss
from tests.cost.graphs import NODE, add_graph, meta, mm_graph, one_op_graph, swap_graph

FAST = TimingSettings(warmup=1, repeats=3, min_loop_seconds=2e-5, retries=0)


def _model(cache_dir: Path, **kw) -> MeasuredCostModel:
    kw.setdefault("line_overhead", False)
    return MeasuredCostModel("cpu", cache_dir=cache_dir, settings=FAST, **kw)


@pytest.fixture
def graph(small_cnn) -> Graph:
    model, batch = small_cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


def _keys(g: Graph) -> set[str]:
    return {call_key(g, n) for n in g.order if not is_swap(g, n)}


def test_profile_writes_the_cache_and_a_second_model_reuses_it(graph: Graph, tmp_path: Path):
    first = _model(tmp_path)
    new = first.profile(graph)
    assert new == len(_keys(graph)) == first.measurements
    assert first.fallbacks == 0
    assert first.profile(graph) == 0
    data = json.loads(first.cache_path.read_text())
    assert data["schema"] == SCHEMA_VERSION and _keys(graph) <= set(data["entries"])

    second = _model(tmp_path)
    assert second.profile(graph) == 0
    seconds = [second.node_seconds(graph, n) for n in graph.order]
    assert second.measurements == 0
    assert seconds == [first.node_seconds(graph, n) for n in graph.order]
    assert all(s > 0 for s in seconds)
    assert step_seconds(second, graph) == pytest.approx(sum(seconds))


def test_loop_timing_and_small_batches_measure_the_same_keys(graph: Graph, tmp_path: Path):
    looped = MeasuredCostModel("cpu", cache_dir=tmp_path / "loop", line_overhead=False,
                               settings=TimingSettings(warmup=1, repeats=3, min_loop_seconds=2e-5,
                                                       interleave=False, retries=0))
    assert looped.profile(graph) == len(_keys(graph))
    one_by_one = _model(tmp_path / "batch", max_batch_bytes=1)
    assert one_by_one.profile(graph) == len(_keys(graph))
    assert all(one_by_one.node_seconds(graph, n) > 0 for n in graph.order)


def test_misses_are_measured_lazily_and_saved(tmp_path: Path):
    g = add_graph(1000)
    model = _model(tmp_path)
    assert model.node_seconds(g, NODE) > 0 and model.measurements == 1
    model.node_seconds(g, NODE)
    assert model.measurements == 1
    assert _model(tmp_path).node_seconds(g, NODE) == model.node_seconds(g, NODE)


def test_default_cache_location_follows_peakcut_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PEAKCUT_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "costs"
    model = MeasuredCostModel("cpu", settings=FAST, line_overhead=False)
    assert model.cache_path.parent == tmp_path / "costs"
    model.node_seconds(add_graph(10), NODE)
    assert model.cache_path.exists()


def _cached_file(tmp_path: Path) -> Path:
    model = _model(tmp_path)
    model.node_seconds(add_graph(1000), NODE)
    return model.cache_path


def _rewrite(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


CORRUPTIONS = {
    "bad json": (lambda p: p.write_text('{"schema": 1, "entries": {'), "not valid JSON"),
    "fingerprint": (lambda p: _rewrite(p, lambda d: d["fingerprint"].update(device="cpu: other")),
                    "fingerprint"),
    "schema": (lambda p: _rewrite(p, lambda d: d.update(schema=SCHEMA_VERSION + 1)), "schema"),
    "types": (lambda p: _rewrite(p, lambda d: next(iter(d["entries"].values())).update(
        seconds="fast")), "seconds is str"),
    "negative": (lambda p: _rewrite(p, lambda d: d.update(line_overhead_seconds=-1.0)),
                 "line_overhead_seconds"),
    "top level": (lambda p: p.write_text("[1, 2]"), "top level is list"),
    "work": (lambda p: _rewrite(p, lambda d: next(iter(d["entries"].values())).update(work=[1, 2])),
             "work is not"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_bad_cache_file_is_reported_and_rebuilt(case: str, tmp_path: Path):
    path = _cached_file(tmp_path)
    corrupt, reason = CORRUPTIONS[case]
    corrupt(path)
    with pytest.warns(RuntimeWarning, match=reason) as record:
        model = _model(tmp_path)
    assert str(path) in str(record[0].message)
    assert model.node_seconds(add_graph(1000), NODE) > 0
    assert model.measurements == 1  # nothing was trusted: measured again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _model(tmp_path).node_seconds(add_graph(1000), NODE) > 0  # rebuilt file is good


def test_cache_key_distinguishes_shapes_dtypes_and_strides():
    base = call_key(mm_graph(8, 16, 32), NODE)
    assert base == call_key(mm_graph(8, 16, 32), NODE)
    assert base != call_key(mm_graph(8, 16, 64), NODE)
    assert base != call_key(mm_graph(8, 16, 32, dtype=torch.float64), NODE)
    transposed = one_op_graph("aten.mm.default", meta(16, 8).t(), meta(16, 32))
    assert base != call_key(transposed, NODE)
    assert call_key(add_graph(4), NODE) != call_key(
        one_op_graph("aten.add.Tensor", meta(4), meta(4), alpha=2), NODE)


def test_calls_that_cannot_run_standalone_fall_back_to_an_estimate(tmp_path: Path):
    q = meta(1, 2, 8, 16)
    g = one_op_graph("aten._scaled_dot_product_efficient_attention.default", q, q, q, None, False)
    model = _model(tmp_path)
    assert model.node_seconds(g, NODE) > 0
    assert model.fallbacks == 1
    (reason,) = model.fallback_reasons.values()
    assert "NotImplementedError" in reason and "analytic:cpu" in reason
    again = _model(tmp_path)
    again.node_seconds(g, NODE)
    assert again.measurements == 0 and again.fallbacks == 1  # the estimate is cached, flagged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ops_with_device_side_value_asserts_are_not_run_on_a_gpu(tmp_path: Path):
    """|randn| is no probability: binary_cross_entropy on it would assert on the device and end
    the process's CUDA context, so it is estimated instead (cost.inputs.VALUE_CHECKED_OPS)."""
    x = meta(4, 8)
    g = one_op_graph("aten.binary_cross_entropy.default", x, x)
    model = MeasuredCostModel("cuda", cache_dir=tmp_path, settings=FAST, line_overhead=False)
    assert model.node_seconds(g, NODE) > 0 and model.fallbacks == 1
    assert "device-side asserts" in next(iter(model.fallback_reasons.values()))
    torch.cuda.synchronize()                 # the context is alive


def test_oversized_calls_are_estimated(tmp_path: Path):
    model = _model(tmp_path, max_input_bytes=1000)
    model.node_seconds(add_graph(1000), NODE)
    assert model.fallbacks == 1 and "max_input_bytes" in next(iter(model.fallback_reasons.values()))


@pytest.mark.parametrize("op,direction", [(STORE_OP, "d2h"), (LOAD_OP, "h2d")])
def test_swap_nodes_cost_a_copy_of_their_bytes(op: str, direction: str, tmp_path: Path):
    model = _model(tmp_path)
    g = swap_graph(op, 1 << 16)
    assert model.node_seconds(g, NODE) == model.copy_seconds(4 << 16, direction) > 0
    assert model.profile(g) == 0
    with pytest.raises(ValueError, match="sideways"):
        model.copy_seconds(16, "sideways")


def test_measuring_leaves_the_rng_alone(tmp_path: Path):
    g = one_op_graph("aten.native_dropout.default", meta(64, 64), 0.5, True)
    state = torch.get_rng_state()
    _model(tmp_path).profile(g)
    assert torch.equal(state, torch.get_rng_state())


def test_line_overhead_is_calibrated_once_and_cached(tmp_path: Path, monkeypatch):
    calls = []
    import peakcut.cost.measured as measured

    real = measured.line_overhead_seconds
    monkeypatch.setattr(measured, "line_overhead_seconds",
                        lambda *a: calls.append(1) or real(*a))
    first = _model(tmp_path, line_overhead=True)
    g = add_graph(100)
    overhead = first.line_overhead_seconds
    assert 0 <= overhead < 1e-4 and len(calls) == 1
    with_overhead = first.node_seconds(g, NODE)
    second = _model(tmp_path, line_overhead=True)
    assert second.node_seconds(g, NODE) == with_overhead and len(calls) == 1
    assert _model(tmp_path).node_seconds(g, NODE) == pytest.approx(with_overhead - overhead)


def test_get_cost_model_names_the_bad_spec():
    with pytest.raises(ValueError, match=r"'h300'.*known: rtx3090, a100-80gb, h100, h200, cpu"):
        get_cost_model("h300")
    with pytest.raises(ValueError, match="'measured:tpu'"):
        get_cost_model("measured:tpu")
    with pytest.raises(TypeError, match="'h200'.*warp"):
        get_cost_model("h200", warp=9)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            get_cost_model("measured:cuda")


def test_every_spec_gives_a_cost_model():
    for spec in ("rtx3090", "a100-80gb", "h100", "analytic:h200", "cpu", "measured",
                 "measured:cpu"):
        model = get_cost_model(spec, **({"line_overhead": False} if "measured" in spec else {}))
        assert isinstance(model, CostModel)
    assert get_cost_model("analytic:h200").name == "analytic:h200"
    measured = get_cost_model("measured:cpu")
    assert measured.name == "measured:cpu" and not measured.overlap_copies
