"""A language model's head and loss in chunks of the sequence (rules.chunked_loss_rule): its
site, chunks of unequal size, a lower simulated peak, and a refusal with the reason of what it
cannot prove: label smoothing, a z-loss, class weights, one loss per token, dropout on the
logits. (Eager's numbers over 3 steps: tests/taso/test_fused_lm.py.)"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.fission.loss import detach_loss
from peakcut.memory import simulate
from peakcut.rules.chunked_loss_rule import ChunkedLossRule
from peakcut.rules.query import Query
from peakcut.transform.head_loss import find_head_losses
from peakcut.transform.rewrite import RuleError
from peakcut.transform.site import RewriteSite

VOCAB, DIM, SEQ, BATCH = 48, 8, 12, 3


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.mix(self.wte(ids)))) * 0.5


def _logits_labels(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = batch
    logits = model(ids)[:, :-1, :].float()
    return logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1)


def shifted_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits, labels = _logits_labels(model, batch)
    return F.cross_entropy(logits, labels, ignore_index=-100)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = ids.clone()
    labels[0, -4:] = -100                          # the first sequence is padded
    return ids, labels


def _graph(loss_fn: Callable[..., torch.Tensor]) -> peakcut.Graph:
    torch.manual_seed(0)
    return detach_loss(peakcut.capture(TinyLM(), _batch(), loss_fn, peakcut.SGD(lr=0.5)))


def test_the_site_and_its_limits() -> None:
    g = _graph(shifted_loss)
    rule = ChunkedLossRule()
    (site,) = rule.sites(Query(g, g.order))
    assert site.params == (2,) and rule.why_not(g, g.order, site) is None       # 11 positions
    rw = rule.apply(g, g.order, RewriteSite(site.kind, site.nodes, "", (4,)))     # 3, 3, 3, 2
    rows = [rw.graph.tensors[n.args[0].id].shape[0] for n in rw.graph.nodes.values()
            if n.op == "aten._log_softmax.default"]
    assert rows == [BATCH * 3] * 3 + [BATCH * 2]
    assert simulate(rw.graph, rw.order, None).peak_bytes < simulate(g, list(g.order), None).peak_bytes
    for chunks in (1, 12):
        assert rule.why_not(g, g.order, RewriteSite(site.kind, site.nodes, "", (chunks,))) is not None
        with pytest.raises(RuleError, match="chunk"):
            rule.apply(g, g.order, RewriteSite(site.kind, site.nodes, "", (chunks,)))


def _smoothed(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(*_logits_labels(model, batch), label_smoothing=0.1)


def _z_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits, labels = _logits_labels(model, batch)
    return F.cross_entropy(logits, labels) + 1e-4 * torch.logsumexp(logits, dim=-1).square().mean()


def _weighted(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(*_logits_labels(model, batch), weight=torch.linspace(0.5, 1.5, VOCAB))


def _per_token(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(*_logits_labels(model, batch), reduction="none").sum()


def _dropout(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits, labels = _logits_labels(model, batch)
    return F.cross_entropy(F.dropout(logits, 0.1), labels)


@pytest.mark.parametrize(("loss_fn", "reason"), [
    (_smoothed, "reads the log-probabilities besides the loss"),
    (_z_loss, r"read by \d nodes .*logsumexp.*a z-loss"),
    (_weighted, "weighs the classes"),
    (_per_token, "one loss per token"),
    (_dropout, "dropout"),
])
def test_what_it_cannot_prove_is_refused_with_the_reason(loss_fn: Callable[..., torch.Tensor], reason: str) -> None:
    g = _graph(loss_fn)
    found = find_head_losses(g)
    assert found and all(isinstance(h, str) for h in found)
    assert any(re.search(reason, h) for h in found if isinstance(h, str)), found
    assert list(ChunkedLossRule().sites(Query(g, g.order))) == []
