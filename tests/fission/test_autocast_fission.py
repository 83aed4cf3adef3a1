"""Fission on a bf16-autocast step: the graph records the real (fp32) LayerNorm statistics, and
fission's part layouts, the graph check and the program agree with them (ir.real_dtypes)."""

from __future__ import annotations

import copy

import torch

import peakcut
from peakcut.fission import expand, find_ftree
from peakcut.fission.loss import detach_loss
from peakcut.ir.check import check_graph
from peakcut.workloads import get_workload
from tests.tolerance import tolerance


def test_batch_fission_of_an_autocast_bert_checks_and_runs() -> None:
    inst = get_workload("bert-base").build("tiny")
    model = inst.model.float()

    def loss_fn(m, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inst.loss_fn(m, b)

    g = detach_loss(peakcut.capture(model, inst.batch, loss_fn, None))
    stats = [g.tensors[n.outputs[1]].dtype for n in g.nodes.values() if n.op == "aten.native_layer_norm.default"]
    assert "float32" in stats
    tree, dgraph = find_ftree(g, batch_only=True)
    root = tree.roots()[0]
    split = expand(g, g.order, tree.with_n(root, 2), dgraph)
    check_graph(split.graph)
    ours = copy.deepcopy(model)
    loss = peakcut.Step(split.graph, split.order)(ours, inst.batch)
    ref = loss_fn(model, inst.batch)
    ref.backward()
    assert float(loss) == float(ref)          # the forward is split along rows: same values
    # gradients: the weight gradients sum two bf16 partial products instead of one
    tol = tolerance(torch.bfloat16, 2)
    num = sum(float(((p.grad - q.grad) ** 2).sum()) for p, q in zip(ours.parameters(), model.parameters(), strict=True))
    den = sum(float((q.grad ** 2).sum()) for q in model.parameters())
    assert (num / den) ** 0.5 <= tol
