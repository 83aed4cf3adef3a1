"""Spatial fission (peakcut.transform.spatial): convolutions, their backwards and chains of
element-wise ops into a convolution run in parts along the rows, with halos. On every tiny CNN
workload and a DenseNet-like model: eager's numbers over 3 AdamW steps (float64: the parts sum
grad_input rows at their borders and grad_weight in another order) at n = 2 and the largest
n the region's rows allow; the peak measured on this CPU within 5% of the simulated one; the
refusals name the node; the rule's sites."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import POLISH
from peakcut.rules.query import Query
from peakcut.transform.batch_norm import split_batch_norms_everywhere
from peakcut.transform.site import RewriteSite
from peakcut.transform.spatial import (
    CONV,
    CONV_BACKWARD,
    ROWS,
    is_pointwise,
    owned,
    split_rows,
    why_not_split_rows,
)
from peakcut.transform.taso.conv_grads import split_conv_grads
from peakcut.workloads import get_workload
from tests.helpers import in_float64, tiny_densenet

RTOL, ATOL = 1e-7, 1e-9   # float64
CNNS = ["resnet50", "unet", "unetpp", "densenet"]


def _at_peak(rule: RewriteRule, g: Graph, order: Sequence[int], nid: int) -> list[RewriteSite]:
    """The rule's sites in the polish after the search, where a plan peaks at node `nid`."""
    return list(rule.sites(Query(g, order, phase=POLISH, peak=nid)))


def _problem(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], object]:
    if name == "densenet":
        return tiny_densenet()
    inst = in_float64(get_workload(name).build("tiny"))
    return inst.model, inst.batch, inst.loss_fn


def _rows(g: Graph, v: int) -> int:
    """The rows a region of node v alone can be split into at most."""
    n = g.nodes[v]
    t = n.args[0].id if n.op == CONV_BACKWARD else n.output_ids()[0]
    return g.tensors[t].shape[ROWS]


def _regions(g: Graph) -> dict[str, list[int]]:
    """One region of each kind: the largest convolution, its backward, the largest strided
    convolution, and a ReLU with the convolution that reads it."""
    convs = [v for v in g.order if g.nodes[v].op == CONV and not g.nodes[v].args[6]]
    backs = [v for v in g.order if g.nodes[v].op == CONV_BACKWARD and not g.nodes[v].args[7]]
    found = {"conv": [max(convs, key=lambda v: _rows(g, v))], "conv_backward": [max(backs, key=lambda v: _rows(g, v))]}
    strided = [v for v in convs if list(g.nodes[v].args[3])[0] > 1]
    if strided:
        found["strided conv"] = [max(strided, key=lambda v: _rows(g, v))]
    for v in sorted(convs, key=lambda v: -_rows(g, v)):
        p = g.producer(g.nodes[v].args[0].id)
        if p is not None and g.nodes[p].op == "aten.relu.default":
            found["relu, conv"] = [p, v]
            break
    return found


def _disjoint(regions: dict[str, list[int]]) -> list[dict[str, list[int]]]:
    """The regions in groups of disjoint ones (each group is split in one graph)."""
    groups: list[dict[str, list[int]]] = []
    for what, nodes in regions.items():
        group = next((gr for gr in groups if not set(nodes) & {v for ns in gr.values() for v in ns}), None)
        if group is None:
            groups.append(group := {})
        group[what] = nodes
    return groups


@pytest.mark.parametrize("name", CNNS)
def test_split_rows_keeps_eager_numbers_and_memory_agreement(name: str) -> None:
    """Each group of disjoint regions is split in one graph, every region at n = 2, then
    every region at its largest n (one equivalence run per group and n, not per region)."""
    model, batch, loss_fn = _problem(name)
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    regions = _regions(g)
    assert {"conv", "conv_backward", "relu, conv"} <= set(regions), regions
    for group in _disjoint(regions):
        largest = {what: min(_rows(g, v) for v in nodes if g.nodes[v].op != "aten.relu.default")
                   for what, nodes in group.items()}
        for at_two in (True, False):
            h, order = g, g.order
            for what, nodes in group.items():
                n = 2 if at_two else largest[what]
                assert why_not_split_rows(h, order, nodes, n) is None, (what, n)
                r = split_rows(h, order, nodes, n)
                check_graph(r.graph)
                assert not set(nodes) & set(r.graph.nodes)
                h, order = r.graph, r.order
            report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                               lambda _m, h=h, order=order: Step(h, order), steps=3,
                                               rtol=RTOL, atol=ATOL)
            assert report.ok, f"{name} {list(group)} at n={'2' if at_two else largest}: {report}"
            assert {"loss", "grad", "param", "state"} <= report.kinds()
            if at_two:
                simulated = simulate(h, order).peak_bytes
                measured = peakcut.measure(Step(h, order), copy.deepcopy(model), batch,
                                           method="cpu-profiler", repeats=1).peak_bytes
                assert abs(simulated - measured) <= 0.05 * measured, (name, list(group), simulated, measured)
        for what, nodes in group.items():
            assert why_not_split_rows(g, g.order, nodes, largest[what] + 1) is not None


def test_parts_own_every_row_once() -> None:
    for height in (1, 7, 64):
        for n in range(1, height + 1):
            rows = [owned(height, k, n) for k in range(n)]
            assert rows[0].start == 0 and rows[-1].stop == height
            assert all(a.stop == b.start and len(a) >= 1 for a, b in itertools.pairwise(rows))


def test_the_program_names_the_parts() -> None:
    model, batch, loss_fn = _problem("unet")
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW())
    nodes = _regions(g)["relu, conv"]
    r = split_rows(g, g.order, nodes, 2)
    source = Step(r.graph, r.order).source
    assert "_rows0_" in source and "constant_pad_nd" in source and "_write_rows" in source


def test_refusals_name_the_node() -> None:
    model, batch, loss_fn = _problem("unetpp")
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW())
    transposed = next(v for v in g.order if g.nodes[v].op == CONV and g.nodes[v].args[6])
    assert "transposed" in why_not_split_rows(g, g.order, [transposed], 2)
    conv = next(v for v in g.order if g.nodes[v].op == CONV and not g.nodes[v].args[6])
    assert "expected a number of parts" in why_not_split_rows(g, g.order, [conv], 1)
    assert "expected a number of parts" in why_not_split_rows(g, g.order, [conv], True)
    assert "fewer than" in why_not_split_rows(g, g.order, [conv], 10**6)
    norm = next(v for v in g.order if g.nodes[v].op == "aten.native_batch_norm.default")
    reason = why_not_split_rows(g, g.order, [norm], 2)
    assert "native_batch_norm" in reason and "does not split it" in reason
    backward = next(v for v in g.order if g.nodes[v].op == CONV_BACKWARD and not g.nodes[v].args[7]
                    and not is_pointwise(g, g.nodes[v]))
    readers = [u for t in g.nodes[backward].output_ids() for u in g.users(t)]
    assert "only add up to" in why_not_split_rows(g, g.order, [backward, readers[0]], 2)
    assert "not in the graph" in why_not_split_rows(g, g.order, [10**9], 2)


def test_a_convolution_with_its_own_backward_is_not_convex() -> None:
    """The loss between a convolution and its backward depends on the one and feeds the other:
    the region's last node reads what the region's first makes, through outside nodes."""
    model, batch, loss_fn = _problem("unet")
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW())
    backward = next(v for v in reversed(g.order) if g.nodes[v].op == CONV_BACKWARD)
    x = g.nodes[backward].args[1].id
    forward = next(u for u in g.users(x) if g.nodes[u].op == CONV and g.nodes[u].args[1] == g.nodes[backward].args[2])
    reason = why_not_split_rows(g, g.order, [forward, backward], 2)
    assert reason is not None and "not convex" in reason and g.nodes[backward].name in reason


def test_rule_sites_apply() -> None:
    model, batch, loss_fn = _problem("unetpp")
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW())
    rule = RULES.rewrite_rule("split_rows")
    sites = list(rule.sites(Query(g, g.order)))
    assert sites and all(len(s.params) == 1 and s.params[0] in (2, 4, 8) for s in sites)
    assert all(g.nodes[s.nodes[0]].op in (CONV, CONV_BACKWARD) for s in sites)
    assert rule.why_not(g, g.order, sites[0]) is None
    r = rule.apply(g, g.order, sites[0])
    check_graph(r.graph)
    assert "parts along the rows" in r.description


def test_channels_last_images_split() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(6, 6, 3, padding=2,
                                dilation=2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 4))
    model = model.double().to(memory_format=torch.channels_last)
    batch = (torch.randn(2, 3, 9, 9, dtype=torch.float64).to(memory_format=torch.channels_last),
             torch.randint(0, 4, (2,)))
    loss_fn = _problem("densenet")[2]
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    for nodes in _regions(g).values():
        for n in (2, 9):
            r = split_rows(g, g.order, nodes, n)
            check_graph(r.graph)
            report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                               lambda _m, r=r: Step(r.graph, r.order), steps=2, rtol=RTOL,
                                               atol=ATOL)
            assert report.ok, f"{nodes} at n={n}: {report}"


def test_element_wise_ops_with_keyword_arguments_split() -> None:
    """After split_batch_norms a convolution's backward reads a batch norm's input gradient made
    by element-wise ops on whole images, one of them addcmul(..., value=): a region holding them
    with the backward passes them their keyword arguments (why_not_split_rows accepted it, and
    the parts were refused). Eager's numbers at n = 2 and the largest n."""
    model, batch, loss_fn = _problem("unet")
    captured = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    split = split_batch_norms_everywhere(captured)
    assert split is not None
    g = split.graph
    backs = [v for v in g.order if g.nodes[v].op == CONV_BACKWARD and not g.nodes[v].args[7]]
    best: list[int] = []
    for back in backs:                       # the backward with the longest element-wise chain before it
        region, v = [back], back
        while True:
            p = g.producer(g.nodes[v].args[0].id) if g.nodes[v].op == CONV_BACKWARD else next(
                (g.producer(t) for t in g.nodes[v].input_ids() if g.producer(t) is not None
                 and g.tensors[t].shape == g.tensors[g.nodes[v].output_ids()[0]].shape), None)
            if p is None or why_not_split_rows(g, g.order, [p, *region], 2) is not None:
                break
            region, v = [p, *region], p
        if len(region) > len(best):
            best = region
    assert any(g.nodes[v].kwargs for v in best), [g.nodes[v].op for v in best]
    for n in (2, _rows(g, best[-1])):
        r = split_rows(g, g.order, best, n)
        check_graph(r.graph)
        report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                           lambda _m, r=r: Step(r.graph, r.order), steps=3, rtol=RTOL, atol=ATOL)
        assert report.ok, f"{[g.nodes[v].op for v in best]} at n={n}: {report}"


def test_grad_input_rows_are_written_once_where_the_parts_tile_them() -> None:
    """Where the parts' grad_input rows cover the image, overlapping only at halos, part k
    copies the rows past the previous part's and adds only the overlap, into a gradient never
    zeroed; a strided 1x1 convolution's parts skip input rows, so its gradient is zeroed and
    every part adds. Eager's numbers either way (float64, 2 AdamW steps)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(6, 6, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(6, 6, 1, stride=2), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(6, 4)).double()
    batch = (torch.randn(2, 3, 16, 16, dtype=torch.float64), torch.randint(0, 4, (2,)))
    loss_fn = _problem("densenet")[2]
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    backs = {g.nodes[v].module: v for v in g.order if g.nodes[v].op == CONV_BACKWARD}
    tiled = {"2": True, "4": False}            # the 3x3 stride-2 and the 1x1 stride-2 convolutions
    for module, expect in tiled.items():
        v = next(u for m, u in backs.items() if m.endswith(module))
        for n in (2, 3):
            r = split_rows(g, g.order, [v], n)
            check_graph(r.graph)
            ops = [r.graph.nodes[u].op for u in r.added]
            grad_input = g.nodes[v].outputs[0]
            alloc = next(r.graph.nodes[u] for u in r.added if grad_input in r.graph.nodes[u].output_ids())
            assert (alloc.op == "aten.empty_strided.default") == expect, (module, n, alloc.op)
            assert ("aten.copy_.default" in ops) == expect, (module, n, ops)
            report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                               lambda _m, r=r: Step(r.graph, r.order), steps=2, rtol=RTOL,
                                               atol=ATOL)
            assert report.ok, f"{module} at n={n}: {report}"


@pytest.mark.parametrize("name", ["unet", "unetpp"])
def test_a_grad_input_only_backward_reads_its_input_shape_only(name: str) -> None:
    """After split_conv_grads, the input-gradient call's parts read a contiguous view of the
    input's shape (no row slice to copy): eager's numbers at n = 2 and the largest n, and
    at n = 2 the measured peak within 5% of the simulated one."""
    model, batch, loss_fn = _problem(name)
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    backward = max((v for v in g.order if g.nodes[v].op == CONV_BACKWARD and not g.nodes[v].args[7]
                    and g.nodes[v].outputs[0] is not None), key=lambda v: _rows(g, v))
    grads = split_conv_grads(g, g.order, [backward])
    h = grads.graph
    (only_input,) = [v for v in grads.added if h.nodes[v].op == CONV_BACKWARD and list(h.nodes[v].args[10]) == [True, False, False]]
    for n in (2, _rows(h, only_input)):
        r = split_rows(h, grads.order, [only_input], n)
        check_graph(r.graph)
        step = Step(r.graph, r.order)
        assert "_shape_only" in step.source
        report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                           lambda _m, r=r: Step(r.graph, r.order), steps=3, rtol=RTOL, atol=ATOL)
        assert report.ok, f"{name} n={n}: {report}"
        if n == 2:
            simulated = simulate(r.graph, r.order).peak_bytes
            measured = peakcut.measure(step, copy.deepcopy(model), batch, method="cpu-profiler", repeats=1).peak_bytes
            assert abs(simulated - measured) <= 0.05 * measured, (name, simulated, measured)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_an_input_gradient_call_does_not_read_its_input_values(dtype: torch.dtype) -> None:
    """What the shape-only view relies on, on this machine's backends: the input gradient is
    the same bit for bit whatever values the input holds."""
    torch.manual_seed(0)
    for k, s, p, d in ((3, 1, 1, 1), (1, 1, 0, 1), (3, 2, 1, 1), (3, 1, 2, 2)):
        x, w = torch.randn(4, 16, 20, 20, dtype=dtype), torch.randn(8, 16, k, k, dtype=dtype)
        gy = torch.randn_like(torch.nn.functional.conv2d(x, w, stride=s, padding=p, dilation=d))
        other = torch.randn(x.numel() + 3, dtype=dtype).as_strided(x.shape, x.stride(), 3)
        args = (w, None, [s, s], [p, p], [d, d], False, [0, 0], 1, [True, False, False])
        want = torch.ops.aten.convolution_backward(gy, x, *args)[0]
        assert torch.equal(torch.ops.aten.convolution_backward(gy, other, *args)[0], want), (k, s, p, d)


def test_at_peak_splits_an_input_gradient_call_not_its_parts() -> None:
    """The polish's site (rules/spatial_rule.py): a backward that makes only the input
    gradient, in 4 parts; not a backward that makes the weight gradient, not a part."""
    model, batch, loss_fn = _problem("unetpp")
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW())
    rule = RULES.rewrite_rule("split_rows")
    backward = max((v for v in g.order if g.nodes[v].op == CONV_BACKWARD and not g.nodes[v].args[7]
                    and g.nodes[v].outputs[0] is not None), key=lambda v: _rows(g, v))
    assert not _at_peak(rule, g, g.order, backward)
    grads = split_conv_grads(g, g.order, [backward])
    h = grads.graph
    calls = {bool(h.nodes[v].args[10][0]): v for v in grads.added if h.nodes[v].op == CONV_BACKWARD}
    assert not _at_peak(rule, h, grads.order, calls[False])         # the weight gradient's call
    (site,) = _at_peak(rule, h, grads.order, calls[True])
    assert site.params == (4,)
    r = rule.apply(h, grads.order, site)
    parts = [v for v in r.added if r.graph.nodes[v].op == CONV_BACKWARD]
    assert len(parts) == 4 and all(not _at_peak(rule, r.graph, r.order, v) for v in parts)
