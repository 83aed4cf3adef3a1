"""Written-out attention (scale, causal `where`, additive mask, softmax) run as the fused
attention PyTorch picks on the CPU (rules.fused_attention_rule): the rewritten step keeps
eager's numbers within float32 rounding over 3 steps and runs no softmax (at this size the
fused kernel's extra copies outweigh the scores: the search prices it); dropout on the
probabilities is refused with a reason."""

from __future__ import annotations

import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.rules.fused_attention_rule import FusedAttentionRule
from peakcut.rules.query import Query
from peakcut.transform.fused_attention import SOFTMAX, find_unit, why_not_fuse
from tests.tolerance import tolerance

SEQ, HEADS, DIM = 16, 2, 8


class Attention(nn.Module):
    """Attention as GPT-Neo writes it out, scaled as BERT does; dropout on the probabilities."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.qkv = nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.out = nn.Linear(HEADS * DIM, HEADS * DIM)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("causal", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool))[None, None])

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = (t.view(b, SEQ, HEADS, DIM).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        s = torch.matmul(q, k.transpose(-1, -2)) / DIM ** 0.5
        s = torch.where(self.causal, s, torch.tensor(torch.finfo(s.dtype).min)) + pad
        p = self.drop(torch.softmax(s, dim=-1))
        return self.out(torch.matmul(p, v).transpose(1, 2).reshape(b, SEQ, HEADS * DIM))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(*batch).square().mean()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    pad = torch.zeros(3, 1, 1, SEQ)
    pad[0, ..., -3:] = torch.finfo(torch.float32).min        # the first sequence is padded
    return torch.randn(3, SEQ, HEADS * DIM), pad


def test_fused_attention_keeps_eager_numbers_and_holds_no_scores() -> None:
    torch.manual_seed(0)
    model, batch, opt = Attention(), _batch(), peakcut.SGD(lr=0.1)
    g = peakcut.capture(model, batch, loss_fn, opt, keep_grads=True)
    rule = FusedAttentionRule()
    (site,) = rule.sites(Query(g, g.order))
    assert rule.why_not(g, g.order, site) is None
    rw = rule.apply(g, g.order, site)
    ops = {n.op for n in rw.graph.nodes.values()}
    assert SOFTMAX not in ops and "aten._softmax_backward_data.default" not in ops
    assert any("flash_attention" in op for op in ops)
    tol = tolerance(torch.float32, SEQ, 3)
    report = peakcut.check_equivalence(model, batch, loss_fn, opt, lambda _m: Step(rw.graph, list(rw.order)),
                                       steps=3, rtol=tol, atol=tol)
    assert report.ok, str(report)


def test_dropout_on_the_probabilities_is_refused() -> None:
    model = Attention(dropout=0.1)
    g = peakcut.capture(model, _batch(), loss_fn, peakcut.SGD(lr=0.1))
    (softmax,) = [v for v in g.order if g.nodes[v].op == SOFTMAX]
    unit = find_unit(g, softmax)
    why = unit if isinstance(unit, str) else why_not_fuse(g, unit)
    assert why is not None and "dropout" in why
    assert list(FusedAttentionRule().sites(Query(g, g.order))) == []
