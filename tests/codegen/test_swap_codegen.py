"""Generated code for recomputes and swaps: compiles for CPU and CUDA, the CUDA copies are
synchronised in the right order with events recorded before they are waited on, host copies
stay out of PyTorch's CPU allocator and are counted apart."""

from __future__ import annotations

import re

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.codegen.source import generate_source
from peakcut.codegen.swap import HostPool, simulated_host_peak
from peakcut.ir.edit import GraphEditor
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.runtime.measure import allocator_events
from peakcut.transform import remat, swap
from tests.conftest import cnn_loss


@pytest.fixture
def rewritten(small_cnn):
    """The small CNN step with one recompute and two swaps (one whose users make a view)."""
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    order = g.order
    (c,) = RULES.hotspot_candidates(g, order, limit=1, kinds=("remat",))
    r = c.apply(g, order)
    conv = next(n for n in r.order if r.graph.nodes[n].op == "aten.convolution.default")
    bnb = next(n for n in r.order
               if r.graph.nodes[n].op == "aten.native_batch_norm_backward.default")
    r = swap(r.graph, r.order, r.graph.nodes[conv].outputs[0], [bnb])
    relu = next(n for n in r.order if r.graph.nodes[n].op == "aten.relu.default")
    view = next(n for n in r.order if r.graph.nodes[n].op == "aten.view.default")
    r = swap(r.graph, r.order, r.graph.nodes[relu].outputs[0], [view])
    return r.graph, r.order


def cuda_source(g, order):
    edit = GraphEditor(g)
    edit.set_device("cuda")
    cuda = edit.finish()
    return generate_source(cuda, order)


def test_sources_compile_for_cpu_and_cuda(rewritten):
    g, order = rewritten
    for source in (generate_source(g, order), cuda_source(g, order)):
        compile(source, "<generated>", "exec")
        assert "def step(" in source and ", host):" in source
        assert "# recompute of " in source


def test_cpu_swaps_use_the_host_pool(rewritten):
    g, order = rewritten
    source = generate_source(g, order)
    assert source.count("= host.empty_strided(") == 2
    assert "torch.cuda" not in source and "pinned" not in source
    assert "torch.ops.peakcut" not in source  # the copies are emitted, not the custom ops


def _lines(source):
    return [line.strip() for line in source.splitlines()]


def _index(lines, pattern, start=0):
    for i in range(start, len(lines)):
        if re.search(pattern, lines[i]):
            return i
    raise AssertionError(f"no line matching {pattern!r} after line {start}")


def test_cuda_copies_are_synchronised_in_order(rewritten):
    g, order = rewritten
    lines = _lines(cuda_source(g, order))
    streams = _index(lines, r"^compute = torch\.cuda\.current_stream\(device\)$")
    assert _index(lines, r"^d2h = torch\.cuda\.Stream") > streams
    assert _index(lines, r"^h2d = torch\.cuda\.Stream") > streams
    for store in (n for n in order if g.nodes[n].op == "peakcut.store.default"):
        (x,) = g.nodes[store].input_ids()
        xn = g.tensors[x].name
        producer = _index(lines, rf"^{xn} = aten\.")
        ready = _index(lines, rf"^ev_{xn}_ready\.record\(compute\)$", producer)
        waits = _index(lines, rf"^d2h\.wait_event\(ev_{xn}_ready\)$", ready)
        pinned = _index(lines, rf"^{xn}_host = host\.empty_strided\(.*pinned=True\)$", waits)
        copy = _index(lines, rf"^{xn}_host\.copy_\({xn}, non_blocking=True\)$", pinned)
        assert lines[copy - 1] == "with torch.cuda.stream(d2h):"
        kept = _index(lines, rf"^{xn}\.record_stream\(d2h\)", copy)
        stored = _index(lines, rf"^ev_{xn}_host_stored\.record\(d2h\)$", kept)
        # the load: allocate on compute, h2d waits for compute and for the store, copies, records
        alloc = _index(lines, rf"^{xn}_loaded = torch\.empty_strided\(.*device=device\)$", stored)
        after_compute = _index(lines, r"^h2d\.wait_stream\(compute\)", alloc)
        after_store = _index(lines, rf"^h2d\.wait_event\(ev_{xn}_host_stored\)$", after_compute)
        load_copy = _index(lines, rf"^{xn}_loaded\.copy_\({xn}_host, non_blocking=True\)$",
                           after_store)
        assert lines[load_copy - 1] == "with torch.cuda.stream(h2d):"
        _index(lines, rf"^{xn}_loaded\.record_stream\(h2d\)$", load_copy)
        loaded = _index(lines, rf"^ev_{xn}_loaded\.record\(h2d\)$", load_copy)
        wait = _index(lines, rf"^compute\.wait_event\(ev_{xn}_loaded\)$", loaded)
        first_use = _index(lines, rf"\b{xn}_loaded\b", wait + 1)
        assert not any(re.search(rf"\b{xn}_loaded\b", line) for line in lines[loaded + 1:wait])
        assert first_use > wait and "aten." in lines[first_use]
        # the host copy lives until the consumer's wait, then goes
        host_del = _index(lines, rf"^del .*\b{xn}_host\b", wait)
        assert host_del == wait + 1
        assert not any(re.search(rf"^del .*\b{xn}_host\b", line) for line in lines[:wait])


def test_every_waited_event_is_recorded_first(small_cnn):
    """The MAGIS reference code waited on an event it never recorded: here each event is
    created and recorded before any wait on it, for every swap of a program with many."""
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    order = g.order
    for _ in range(4):
        (c,) = RULES.hotspot_candidates(g, order, limit=1, kinds=("swap",))
        r = c.apply(g, order)
        g, order = r.graph, r.order
    lines = _lines(cuda_source(g, order))
    recorded: set[str] = set()
    waited = 0
    for line in lines:
        if m := re.match(r"^(ev_\w+)\.record\(", line):
            recorded.add(m.group(1))
        if m := re.search(r"wait_event\((ev_\w+)\)", line):
            assert m.group(1) in recorded, line
            waited += 1
    # per swap: d2h waits for the producer, h2d for the store, compute for the load
    assert waited == 3 * 4


def test_host_pool_is_invisible_to_the_cpu_allocator_and_counted_apart():
    pool = HostPool()

    def run():
        x = torch.randn(64, 32)
        host = pool.empty_strided((32, 64), (1, 32), torch.float32)
        host.copy_(x.t())
        assert pool.live_bytes == 64 * 32 * 4
        y = torch.empty_strided((32, 64), (1, 32), dtype=torch.float32)
        y.copy_(host)
        del host
        assert pool.live_bytes == 0
        return y

    sizes, y = allocator_events(run)
    assert sorted(s for s in sizes if s > 0) == [64 * 32 * 4, 64 * 32 * 4]  # x and y only
    assert pool.peak_bytes == 64 * 32 * 4 and y.stride() == (1, 32)
    pool.reset_peak()
    assert pool.peak_bytes == 0


def test_step_reports_host_bytes_and_measures_like_the_simulator(small_cnn, rewritten):
    model, batch = small_cnn
    g, order = rewritten
    step = Step(g, order)
    assert step.host_peak_bytes == 0
    measured = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=1)
    assert measured.peak_bytes == simulate(g, order).peak_bytes
    assert step.host_peak_bytes == simulated_host_peak(g, order) > 0
    assert step.host.live_bytes == 0


def test_programs_without_swaps_are_unchanged(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "sgd")
    step = Step(g)
    assert "host" not in step.source.split("def step(")[1].split(")")[0]
    step(model, batch)
    assert step.host_peak_bytes == 0


def test_recompute_comment_names_the_original(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    relu = next(n for n in g.order if g.nodes[n].op == "aten.relu.default")
    view = next(n for n in g.order if g.nodes[n].op == "aten.view.default")
    r = remat(g, g.order, relu, [view])
    lines = _lines(generate_source(r.graph, r.order))
    i = _index(lines, r"^# recompute of relu$")
    assert lines[i + 1].startswith("relu_remat = aten.relu.default(")


def test_fake_tracking_of_swapped_programs_is_refused_clearly(rewritten):
    g, order = rewritten
    with pytest.raises(NotImplementedError, match="fake-tracker"):
        peakcut.runtime.fake_tracked_peak(Step(g, order))
