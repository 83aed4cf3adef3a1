"""Fission on every tiny workload, in float64 (SGD with momentum, gradients kept as outputs).

Why float64: a split sums a weight gradient's batch contributions in partial sums, in another
order than one big kernel. Where they cancel, a small element of a large fp32 gradient carries
the partials' rounding (ResNet's stem convolution: |grad| up to 5.2, 2e-5 off on one element
at n = 4). In float64 the same splits agree to ~1e-13, so the comparison can be strict.
Why SGD: AdamW divides each update by the element's own gradient magnitude, so a gradient
that is zero up to rounding (attention key biases, which softmax cancels) gets an update of
~lr whose sign is rounding noise; AdamW fission is checked on the small models of
test_expand.py.

For each workload the F-Tree comes from peakcut.fission.build.find_ftree(g, batch_only=True) on the
loss-detached step (peakcut.fission.loss, so regions may span forward, loss and backward), or
from every D-Graph component when the batch dimension yields no F-Tree node. The CNNs'
batch dimension is cut by each training-mode BatchNorm into stretches (build.batch_components);
U-Net's tree holds the stretch from its last BatchNorm through the loss and back. Each node is
enabled alone, at the smallest valid n (2 where 2 divides its length) and at the largest (its
length), expanded (peakcut.fission.expand) and built with fission loops, then

1. the step matches eager PyTorch (gradients, parameters, optimizer state, buffers) at
   rtol 1e-7 / atol 1e-9 over 2 steps; the loss within tests.tolerance of a float32 mean
   over the batch's tokens (BTLM computes its loss in float32 even in a float64 model, and
   a split sums it in parts: a few ulps, more or fewer by the machine's kernels);
2. the peak measured on CPU (allocator events, runtime.measure 'cpu-profiler') is within 5%
   of the expanded graph's simulated peak.

Runtime: every node of every tree is tested; for trees of more than SMALL_TREE nodes the
comparison runs 1 step instead of 2 and the peak is measured at the smallest n only (the
largest n is still checked for numbers). A region of views only (its outputs all run whole
after the parts, see fission.expand) has empty parts: it changes nothing and emits no loop.
A workload whose analysis yields no F-Tree node fails with a message naming what to look at.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.fission.build import find_ftree
from peakcut.fission.dgraph import DGraph
from peakcut.fission.expand import expand
from peakcut.fission.ftree import FTree, divisors
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.workloads import WORKLOAD_NAMES, get_workload
from tests.helpers import in_float64
from tests.tolerance import tolerance

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9, weight_decay=1e-2)
SMALL_TREE = 4
RTOL, ATOL = 1e-7, 1e-9  # float64


def loss_tolerance(batch: tuple[torch.Tensor, ...], steps: int) -> tuple[float, float]:
    """A float32 loss summed over the batch's first input's elements, carried `steps` steps."""
    tol = tolerance(torch.float32, batch[0].numel(), steps)
    return tol, tol


def ftree_of(g: Graph, name: str) -> tuple[FTree, DGraph, str]:
    """The batch-only F-Tree, or the all-component one when that is empty; fails when both are."""
    tree, dgraph = find_ftree(g, batch_only=True)
    if tree.nodes:
        return tree, dgraph, "batch component"
    tree, dgraph = find_ftree(g)
    if not tree.nodes:
        pytest.fail(f"{name}: find_ftree() found no F-Tree node, neither on the batch component nor "
                    f"on any of the {len(dgraph.components)} D-Graph components: look at the "
                    "dimension rules (peakcut.ir.dims), the D-Graph and trans.why_not_valid")
    return tree, dgraph, "all components"


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_each_ftree_node_alone_keeps_numbers_and_memory_agreement(name: str) -> None:
    inst = in_float64(get_workload(name).build("tiny"))
    g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True))
    tree, dgraph, source = ftree_of(g, name)
    small = len(tree.nodes) <= SMALL_TREE
    steps = 2 if small else 1
    baseline = simulate(g).peak_bytes
    lines = [f"\n{name}: {len(tree.nodes)} F-Tree nodes ({source}); simulated peak {baseline:,} B"]
    for f in tree.nodes:
        ns = sorted({divisors(f.length)[0], divisors(f.length)[-1]})
        for n in ns:
            enabled = FTree(tuple(replace(x, n=n) if x.id == f.id else x for x in tree.nodes))
            ex = expand(g, g.order, enabled, dgraph)
            report = peakcut.check_equivalence(
                inst.model, inst.batch, inst.loss_fn, SPEC,
                lambda _model, ex=ex: Step(ex.graph, ex.order), steps=steps, rtol=RTOL, atol=ATOL,
                loss_tolerance=loss_tolerance(inst.batch, steps))
            what = f"{name} F-Tree node {f.id} ({len(f.nodes)} nodes) at n={n}"
            assert report.ok, f"{what}: {report}"
            assert {"loss", "grad", "param", "state"} <= report.kinds()
            simulated = simulate(ex.graph, ex.order).peak_bytes
            if not small and n != ns[0]:
                lines.append(f"  node {f.id} ({len(f.nodes)} nodes) n={n}: equivalent over "
                             f"{steps} step(s); simulated {simulated:,} B (not measured)")
                continue
            step = Step(ex.graph, ex.order)
            if any(part for region in ex.regions for part in region.parts):
                assert "for part in range(" in step.source, what
            measured = peakcut.measure(step, inst.model, inst.batch, method="cpu-profiler",
                                       repeats=1).peak_bytes
            gap = (simulated - measured) / measured
            lines.append(f"  node {f.id} ({len(f.nodes)} nodes) n={n}: equivalent over {steps} "
                         f"step(s); simulated {simulated:,} B, measured {measured:,} B "
                         f"({gap:+.2%})")
            assert abs(simulated - measured) <= 0.05 * measured, (what, simulated, measured)
    print("\n".join(lines))
