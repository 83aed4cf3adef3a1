"""The generated substitutions in the search (rules.generated_rule, in RULES): on two tiny
steps, every generated rewrite the search applies is a rule of the committed, verified set and
proves again, and the plan keeps eager PyTorch's numbers over 3 steps."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.graph import Graph
from peakcut.optimizer import optimize_graph
from peakcut.rules import RULES, WITH_FUSED, Registry
from peakcut.rules.fused_attention_rule import FusedAttentionRule
from peakcut.rules.generated_rule import GeneratedRule
from peakcut.taso import Verifier, load
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite
from tests.taso.conftest import Toy, toy_loss
from tests.tolerance import tolerance

STEPS = 3


class Branchy(nn.Module):
    """Two matmuls of one activation summed, and ReLU of a ReLU read through two transposes."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 16) / 3)
        self.v1 = nn.Parameter(torch.randn(16, 4) / 4)
        self.v2 = nn.Parameter(torch.randn(16, 4) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ self.w)
        return h @ self.v1 + h @ self.v2 + torch.relu(torch.relu(h)).t().t()[:, :4]


def branchy_loss(model: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return model(*batch).square().mean()


class Recording(GeneratedRule):
    """The generated rule, keeping every site it is applied at (a test's probe)."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[RewriteSite] = []

    def apply(self, g: Graph, order: Any, site: RewriteSite) -> Rewrite:
        self.applied.append(site)
        return super().apply(g, order, site)


def _registry(rule: GeneratedRule) -> Registry:
    """RULES with `rule` in the generated rule's place."""
    return Registry(regions=RULES.regions, programs=RULES.programs,
                    rewrites=tuple(rule if r.kind == rule.kind else r for r in RULES.rewrites))


@pytest.mark.parametrize("make", [
    lambda: (Branchy(), (torch.randn(6, 8),), branchy_loss),
    lambda: (Toy(), (torch.randn(6, 8),), toy_loss),
], ids=["branchy", "toy"])
def test_search_applies_only_verified_rules_and_keeps_eager_numbers(
        make: Callable[[], tuple[nn.Module, tuple[torch.Tensor], Callable[..., Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("peakcut.optimizer.api.isolated", lambda measures: False)  # the probe records here
    torch.manual_seed(0)
    model, batch, loss_fn = make()
    eager = copy.deepcopy(model)
    rule = Recording()
    plan = peakcut.optimize(model, batch, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1),
                            memory_limit=1.0, device="cpu", time_budget=float("inf"), max_states=12,
                            verify=False, rules=_registry(rule))
    committed = {r.name: r for r in load().rules}
    for site in rule.applied:
        used = rule.rule_of(site)
        assert used is not None and committed.get(used.name) == used, site
        assert Verifier(used.inputs).prove(used.src, used.dst).proved, used.describe()
    # the plan holds one (branchy: two matmuls of h summed become one; toy: a slice of a cat)
    assert rule.applied and any(a.startswith("generated: ") for a in plan.report["rewrites"]), plan.report

    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    tol = tolerance(torch.float32, 16, STEPS)
    for _ in range(STEPS):
        want = loss_fn(eager, batch)
        want.backward()
        opt.step()
        opt.zero_grad()
        got = plan.step(batch)
        torch.testing.assert_close(got, want.detach(), rtol=tol, atol=tol)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol, msg=name)


def test_the_default_registry_holds_the_generated_rule_and_not_fused_attention() -> None:
    assert GeneratedRule.kind in RULES.rewrite_kinds
    assert FusedAttentionRule.kind not in RULES.rewrite_kinds
    assert FusedAttentionRule.kind in WITH_FUSED.rewrite_kinds
    with pytest.raises(ValueError, match="rules="):
        optimize_graph(peakcut.capture(Branchy(), (torch.randn(2, 8),), branchy_loss),
                               time_budget=0, rules=RULES.rewrites)  # type: ignore[arg-type]
