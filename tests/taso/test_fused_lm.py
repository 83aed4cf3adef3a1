"""Every fused substitution (rules.registry.WITH_FUSED's fused attention and chunked loss) on
the tiny GPT-Neo-1.3B (batch 2) and BTLM-3B (batch 1) steps, with ignored targets: the
rewritten step runs no softmax over the scores and no log-softmax over the whole logits, and
over 3 AdamW steps keeps the user's eager loop's loss, gradients, parameters and optimizer
state within float32 rounding for a reduction of the sequence."""

from __future__ import annotations

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.rules import WITH_FUSED
from peakcut.rules.query import Query
from peakcut.transform.chunked_loss import find_chunkable
from peakcut.transform.rewrite import Rewrite
from peakcut.workloads import get_workload
from tests.tolerance import tolerance

pytest.importorskip("transformers")

FUSED = ("fused_attention", "chunked_loss")
ADAMW = peakcut.AdamW(lr=1e-3, weight_decay=0.01)


def _fused(g: Graph) -> tuple[Rewrite, list[str]]:
    """g with the first site of each fused rule applied in turn, and the rewrites' lines."""
    h, order, done = g, list(g.order), []
    rw: Rewrite | None = None
    for kind in FUSED:
        rule = WITH_FUSED.rewrite_rule(kind)
        site = next(iter(rule.sites(Query(h, order))))
        assert rule.why_not(h, order, site) is None
        rw = rule.apply(h, order, site)
        h, order = rw.graph, list(rw.order)
        done.append(rw.description)
    assert rw is not None
    return rw, done


@pytest.mark.parametrize(("name", "batch_size"), [("gpt-neo-1.3b", 2), ("btlm-3b", 1)])
def test_fused_substitutions_keep_eager_numbers(name: str, batch_size: int) -> None:
    inst = get_workload(name).build("tiny", batch_size=batch_size)
    ids, mask, labels = inst.batch
    labels = labels.clone()
    labels[0, -5:] = -100                     # ignored targets: the mean counts the others
    batch = (ids, mask, labels)
    g = detach_loss(peakcut.capture(inst.model, batch, inst.loss_fn, ADAMW, keep_grads=True))
    rw, done = _fused(g)
    assert len(done) == 2 and "chunks" in done[1]
    ops = [n.op for n in rw.graph.nodes.values()]
    assert "aten._softmax.default" not in ops and any("flash_attention" in op for op in ops)
    rows = ids.shape[0] * (ids.shape[1] - 1)   # the loss's rows
    g2 = rw.graph
    assert all(g2.tensors[n.args[0].id].shape[0] < rows for n in g2.nodes.values() if n.op == "aten._log_softmax.default")
    assert find_chunkable(rw.graph) == []
    tol = tolerance(torch.float32, ids.shape[1], 3)
    report = peakcut.check_equivalence(inst.model, batch, inst.loss_fn, ADAMW,
                                       lambda _m: Step(rw.graph, list(rw.order)), steps=3, rtol=tol, atol=tol)
    assert report.ok, str(report)


def test_fused_substitutions_under_bf16_autocast_stay_as_near_as_eager() -> None:
    """Under bf16 autocast (how users train in bf16), the fused step is judged as
    bench.fuzz judges autocast: norm-wise, within bf16's rounding or a few times eager's own
    distance from the loop without autocast, over 3 AdamW steps."""
    from bench.fuzz.loop import UserLoop, autocast_tolerance, run_user_loop

    inst = get_workload("gpt-neo-1.3b").build("tiny", batch_size=2)

    def autocast_loss(m: torch.nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inst.loss_fn(m, b)

    g = detach_loss(peakcut.capture(inst.model, inst.batch, autocast_loss, ADAMW, keep_grads=True))
    rw, done = _fused(g)
    assert len(done) == 2
    loop = UserLoop(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01))
    report = run_user_loop(inst.model, inst.batch, autocast_loss, loop,
                           lambda _m, opt: Step(rw.graph, list(rw.order), optimizer=opt), steps=3,
                           tolerance=autocast_tolerance(3), seed=0, precise_loss_fn=inst.loss_fn)
    assert report.ok, str(report)
