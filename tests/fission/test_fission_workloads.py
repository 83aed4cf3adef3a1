"""Fission on every tiny workload (SGD with momentum, gradients kept as outputs for the comparison).

Why SGD here: a split sums weight gradients part by part, in another order than one big
matmul, so gradients differ by rounding (~1e-7 relative; they are compared strictly).
AdamW divides each element's update by that element's own gradient magnitude, so where a
gradient is rounding noise the update is ~lr either way: after splits into up to 32 parts a
few weight elements moved by ~1.5e-6 (> atol 1e-6). SGD keeps the parameter and state
comparison strict; AdamW fission is checked on the small models of test_expand.py.

For each workload the F-Tree comes from peakcut.fission.build.analyze(g, batch_only=True), or
from every D-Graph component when the batch one yields no F-Tree node (the CNNs: training-mode
BatchNorm reduces over the batch, so their batch component is tiny). Each F-Tree node is
enabled alone, at the smallest valid n (2 where 2 divides its length) and at the largest (its
length), expanded (peakcut.fission.expand) and built with fission loops, then

1. the step matches eager PyTorch (loss, gradients, parameters, optimizer state, buffers) at
   fp32 rtol 1e-5 / atol 1e-6, over 2 steps. One exception, for the parameters whose gradient
   is zero up to rounding (eager |grad| <= 1e-8, AdamW's eps: the key biases of attention,
   which softmax cancels): their gradients must match like all others, but AdamW divides
   such a gradient by its own magnitude, so their update is rounding noise scaled up to
   ~lr, and a split that sums in another order moves them differently. Their parameter and
   optimizer-state comparisons are reported, not required;
2. the peak measured on CPU (allocator events, runtime.measure 'cpu-profiler') is within 5%
   of the expanded graph's simulated peak.

Runtime: every node of every tree is tested; for trees of more than SMALL_TREE nodes the
comparison runs 1 step instead of 2 and the peak is measured at the smallest n only (the
largest n is still checked for numbers). A region of views only (its outputs all run whole
after the parts, see fission.expand) has empty parts: it changes nothing and emits no loop.
A workload whose analysis yields no F-Tree node fails with a message naming what to look at.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.fission.build import analyze
from peakcut.fission.dgraph import DGraph
from peakcut.fission.expand import expand
from peakcut.fission.ftree import FTree, divisors
from peakcut.ir.graph import Graph
from peakcut.runtime.equivalence import Difference, EquivalenceReport
from peakcut.workloads import WORKLOAD_NAMES, WorkloadInstance, get_workload

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9, weight_decay=1e-2)
SMALL_TREE = 4
NOISE_GRAD = 1e-8   # AdamW's eps: below it, the update of a parameter follows rounding noise


def noise_gradient_params(inst: WorkloadInstance) -> set[str]:
    """Parameters whose eager gradient is zero up to rounding (see the module doc)."""
    model = copy.deepcopy(inst.model)
    inst.loss_fn(model, inst.batch).backward()
    return {name for name, p in model.named_parameters()
            if p.grad is not None and float(p.grad.abs().max()) <= NOISE_GRAD}


def real_failures(report: EquivalenceReport, noise: set[str]) -> list[Difference]:
    """The comparisons that fail, less the updates of noise-gradient parameters."""
    def excused(d: Difference) -> bool:
        owner = d.name if d.kind == "param" else d.name.rpartition(".")[0]
        return d.kind in ("param", "state") and owner in noise
    return [d for d in report.failures() if not excused(d)]


def ftree_of(g: Graph, name: str) -> tuple[FTree, DGraph, str]:
    """The batch-only F-Tree, or the all-component one when that is empty; fails when both are."""
    tree, dgraph = analyze(g, batch_only=True)
    if tree.nodes:
        return tree, dgraph, "batch component"
    tree, dgraph = analyze(g)
    if not tree.nodes:
        pytest.fail(f"{name}: analyze() found no F-Tree node, neither on the batch component nor "
                    f"on any of the {len(dgraph.components)} D-Graph components: look at the "
                    "dimension rules (peakcut.ir.dims), the D-Graph and trans.why_not_valid")
    return tree, dgraph, "all components"


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_each_ftree_node_alone_keeps_numbers_and_memory_agreement(name: str) -> None:
    inst = get_workload(name).build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True)
    tree, dgraph, source = ftree_of(g, name)
    small = len(tree.nodes) <= SMALL_TREE
    steps = 2 if small else 1
    baseline = g.simulate().peak_bytes
    noise = noise_gradient_params(inst)
    lines = [f"\n{name}: {len(tree.nodes)} F-Tree nodes ({source}); simulated peak {baseline:,} B"]
    for f in tree.nodes:
        ns = sorted({divisors(f.length)[0], divisors(f.length)[-1]})
        for n in ns:
            enabled = FTree(tuple(replace(x, n=n) if x.id == f.id else x for x in tree.nodes))
            ex = expand(g, g.order, enabled, dgraph)
            report = peakcut.check_equivalence(
                inst.model, inst.batch, inst.loss_fn, SPEC,
                lambda _model, ex=ex: Step(ex.graph, ex.order), steps=steps, rtol=1e-5, atol=1e-6)
            what = f"{name} F-Tree node {f.id} ({len(f.nodes)} nodes) at n={n}"
            assert not real_failures(report, noise), f"{what}: {report}"
            if not report.ok:
                lines.append(f"  node {f.id} n={n}: updates of zero-gradient parameters differ: "
                             + ", ".join(sorted({d.name for d in report.failures()})))
            assert {"loss", "grad", "param", "state"} <= report.kinds()
            simulated = ex.graph.simulate(ex.order).peak_bytes
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
