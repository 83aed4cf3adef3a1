"""The moves a plan makes on FSDP2 steps beyond the single-process ones, on 2 gloo ranks.

Reshard after forward as a rule: the backward reads a second all-gather of each
parameter's shard, the full parameters gathered for the forward are freed before it, and the
step's numbers do not change.

Two gloo ranks, the GPT-like model in float64 under fully_shard (each block and the root),
batch 8: the captured step in a memory-aware order peaks early in the backward, where every
full parameter the backward reads is alive. `regather` at every site the rule finds lowers
that peak by about the gathered bytes; the program trains like the user's FSDP2 loop over 3
steps (tests.tolerance for float64: a second gather brings the same bytes, so only the
order of independent work changed), and its measured peak is the simulated one within 5%.
The gathered storages' lifetimes follow the wait: a functional wait's result is its argument,
one storage (capture.fully_sharded.waits_in_place).

Per-tensor offload of a shard and of its optimizer state (what FSDP2's CPUOffloadPolicy does
for all of them at once): offload_state and offload_param at every site keep the shards'
AdamW moments and the parameter shards in host buffers, the optimizer's state stays a DTensor
(sharded like its parameter, its shard in the host buffer), and the numbers do not change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed.models import TinyGPT, adamw_two_groups, gpt_batch, gpt_loss
from tests.distributed.spawn import run_ranks
from tests.distributed.test_data_parallel import _close, _fsdp2, _full, eager_step
from tests.tolerance import tolerance

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

STEPS = 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _fsdp2(TinyGPT().double())


class _Run:
    """One rank's two FSDP2 copies of the model, their optimizers and batches, and our copy's
    step captured and ordered for memory."""

    def __init__(self, rank: int) -> None:
        import peakcut
        from peakcut.fission.loss import detach_loss
        from peakcut.schedule import schedule
        from peakcut.spec.fully_sharded import describe_fully_sharded

        self.eager, self.ours = _model(), _model()
        self.opt_eager, self.opt_ours = adamw_two_groups(self.eager), adamw_two_groups(self.ours)
        self.batches = [gpt_batch(rank, step, 8) for step in range(STEPS)]
        self.g = detach_loss(peakcut.capture(self.ours, self.batches[0], gpt_loss, self.opt_ours, max_grad_norm=1.0,
                                             fully_sharded=describe_fully_sharded(self.ours)))
        self.order = list(schedule(self.g, time_limit=5.0).order)

    def trains_like_eager(self, g: object, order: list[int]) -> object:
        """The program (g, order) trains our copy as FSDP2's loop trains the other, over STEPS."""
        import peakcut

        step = peakcut.build(g, order, optimizer=self.opt_ours)
        tol = tolerance(torch.float64, self.batches[0][0].numel(), STEPS)
        for k, batch in enumerate(self.batches):
            _close(step(self.ours, batch), eager_step(self.eager, self.opt_eager, batch, gpt_loss), f"loss {k}", tol)
        for (name, p), q in zip(self.ours.named_parameters(), self.eager.parameters(), strict=True):
            _close(_full(p), _full(q), name, tol)
        return step


def _regathers(rank: int, world: int, out: str) -> None:
    import peakcut
    from peakcut.memory import simulate
    from peakcut.rules.query import Query
    from peakcut.rules.regather_rule import RegatherRule

    run = _Run(rank)
    ours, batches, g, order = run.ours, run.batches, run.g, run.order
    before = simulate(g, order)
    rule = RegatherRule()
    sites = list(rule.sites(Query(g, order, profile=before)))
    rewrite, reasons = rule.apply_many(g, order, sites)
    if rewrite is None:
        raise AssertionError(f"regather applied nowhere: {reasons}")
    after = simulate(rewrite.graph, rewrite.order)
    step = run.trains_like_eager(rewrite.graph, rewrite.order)
    measured = peakcut.measure(step, ours, batches[0], method="cpu-profiler", repeats=1).peak_bytes
    gathered = sum(g.storages[g.tensors[s.tensor].storage] for s in sites)
    Path(out, f"{rank}.json").write_text(json.dumps({
        "sites": len(sites), "applied": sum(r is None for r in reasons), "before": before.peak_bytes,
        "after": after.peak_bytes, "gathered": gathered, "simulated": simulate(step.graph, step.order).peak_bytes,
        "measured": measured}))


def test_regathered_parameters_free_the_forward_gathers_and_keep_the_numbers(tmp_path: Path) -> None:
    run_ranks(_regathers, 2, tmp_path, str(tmp_path))
    for rank in range(2):
        r = json.loads((tmp_path / f"{rank}.json").read_text())
        assert r["applied"] == r["sites"] > 0, r
        assert r["after"] < r["before"], r
        assert r["before"] - r["after"] >= 0.5 * r["gathered"], r
        assert abs(r["simulated"] - r["measured"]) <= 0.05 * r["measured"], r


def _offloads(rank: int, world: int, out: str) -> None:
    from peakcut.memory import simulate
    from peakcut.rules import RULES
    from peakcut.rules.query import Query

    run = _Run(rank)
    g, order = run.g, run.order
    applied = {}
    for kind in ("offload_state", "offload_param"):
        rule = RULES.program_rule(kind)
        rewrite, reasons = rule.apply_many(g, order, list(rule.sites(Query(g, order, profile=simulate(g, order)))))
        if rewrite is None:
            raise AssertionError(f"{kind} applied nowhere: {reasons}")
        applied[kind] = sum(r is None for r in reasons)
        g, order = rewrite.graph, rewrite.order
    run.trains_like_eager(g, order)
    from torch.distributed.tensor import DTensor
    sharded = all(isinstance(v, DTensor) for s in run.opt_ours.state.values() for k, v in s.items() if k != "step")
    Path(out, f"offload-{rank}.json").write_text(json.dumps({**applied, "sharded_state": sharded}))


def test_offloaded_shards_and_state_keep_the_numbers(tmp_path: Path) -> None:
    run_ranks(_offloads, 2, tmp_path, str(tmp_path))
    for rank in range(2):
        r = json.loads((tmp_path / f"offload-{rank}.json").read_text())
        assert r["offload_state"] > 0 and r["offload_param"] > 0 and r["sharded_state"], r

