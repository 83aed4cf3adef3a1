"""Plans run with their arena: each placed result is a view into one buffer made once per step,
the numbers are those of the same plan without the arena (bit for bit: the same kernels) and
of eager PyTorch over 3 steps, and the measured peak is held + arena + the unplanned remainder.

The models are a tiny GPT-like transformer, planned with a fission region emitted as a loop
and a recompute (placements inside the loop body: one offset for every part where the layout
gives them the same, a conditional view where it does not), and a tiny CNN, planned with a
fission region, a recompute and a swap (the swap's host copies beside the arena's views).
The plans use SGD with momentum: under AdamW a gradient that is zero up to rounding (an
attention key bias) moves by rounding noise alone (tests/loop/test_transformer_loop.py).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.codegen.program import Step
from peakcut.codegen.source import generate_source
from peakcut.fission.build import find_ftree
from peakcut.fission.expand import expand
from peakcut.fission.ftree import FTree, divisors
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.ir.tags import FissionTag
from peakcut.rules import RULES
from peakcut.runtime.measure import bound_peak, held_input_bytes
from tests.helpers import cross_entropy_loss
from tests.tolerance import tolerance

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9, weight_decay=1e-2)   # (AdamW: tests.loop's note on noise)
STEPS = 3


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.Sequential(*(Block(width, 4) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits = model(batch[0])
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.body(x)).flatten(1))


def gpt() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], object]:
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return TinyGPT(), (ids, torch.roll(ids, -1, 1)), lm_loss


def cnn() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], object]:
    torch.manual_seed(0)
    return TinyCNN(), (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))), cross_entropy_loss


def plan_of(g: Graph, variant: str) -> tuple[Graph, list[int]]:
    """A plan of the loss-detached step g: its largest batch fission region that runs as a loop
    in 2 parts, then "loop": a recompute that keeps the loop; "swap": a recompute and a swap
    (the region then unrolled: swap code runs at the top level)."""
    g = detach_loss(g)
    order = list(g.order)
    tree, dgraph = find_ftree(g, batch_only=True)
    if tree.nodes:
        for f in sorted(tree.nodes, key=lambda f: -len(f.nodes)):      # the largest that runs as a loop
            n = next(d for d in divisors(f.length) if d > 1)
            ex = expand(g, order, FTree(tuple(replace(x, n=n) if x.id == f.id else x for x in tree.nodes)), dgraph)
            if "for part in range(" in generate_source(ex.graph, ex.order):
                break
        g, order = ex.graph, list(ex.order)
    for kind in ("remat",) if variant == "loop" else ("remat", "swap"):
        for candidate in RULES.hotspot_candidates(g, order, limit=8, kinds=(kind,)):
            r = candidate.apply(g, order)
            if variant != "loop" or "for part in range(" in generate_source(r.graph, r.order):
                break                       # (the loop stays a loop)
        g, order = r.graph, list(r.order)
    return g, order


def part_one_moved(g: Graph, ap: ArenaPlan) -> ArenaPlan:
    """`ap` with the storages of fission part 1 moved above the arena (a valid layout still:
    they keep their places relative to each other, apart from everything else)."""
    ones = {g.tensors[t].storage for n in g.nodes.values()
            if (tag := n.tags.get(FissionTag)) is not None and tag.part == 1 for t in n.output_ids()}
    size = ap.arena_bytes
    offsets = {s: o + size if s in ones else o for s, o in ap.placement.offsets.items()}
    return replace(ap, placement=replace(ap.placement, offsets=offsets, arena_bytes=2 * size),
                   layout=replace(ap.layout, arena_bytes=2 * size))


def run(step: Step, model: nn.Module, batch: object) -> list[torch.Tensor]:
    losses = [step(model, batch).detach().clone() for _ in range(STEPS)]
    return losses + [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("make", "variant"), [(gpt, "loop"), (cnn, "swap")], ids=["gpt-loop", "cnn-swap"])
def test_arena_plan_keeps_the_numbers_and_its_peak(make, variant):
    model, batch, loss_fn = make()
    g, order = plan_of(peakcut.capture(model, batch, loss_fn, SPEC, keep_grads=True), variant)
    placed = Step(g, order, arena=True)
    src = placed.source
    assert "arena[" in src and "# placed in the arena" in src
    assert "# recompute of " in src and "# fission region " in src
    if variant == "loop":
        loop = src[src.index("    for part in range("):]
        assert "# placed in the arena" in loop.split("\n    # ")[0]    # in the loop's body
    else:
        assert "host." in src
    # bit for bit the plan without the arena: the same kernels, through their out overloads
    trained = copy.deepcopy(model)
    got = run(placed, trained, batch)
    want = run(Step(g, order), copy.deepcopy(model), batch)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    if variant == "loop":                   # part 1's results elsewhere than part 0's: a view per part
        shifted = Step(g, order, arena=part_one_moved(g, placed.arena_plan))
        assert " if part == 0 else " in shifted.source
        assert all(torch.equal(a, b) for a, b in zip(run(shifted, copy.deepcopy(model), batch), want, strict=True))
    arena = placed.arena
    assert arena is not None and arena.numel() == placed.arena_plan.arena_bytes
    # measured peak (allocator events) = held + arena (made before the call) + unplanned remainder
    inputs = placed.bind(trained, batch)
    ap = placed.arena_plan
    held = held_input_bytes(placed, inputs)
    measured = bound_peak(placed, inputs, "cpu", held)        # (the arena, made, counted as held)
    del inputs
    assert placed.arena is arena            # made once, kept across steps
    assert held == ap.held_bytes
    assert abs(measured - ap.needed_bytes) <= 0.01 * ap.needed_bytes, (measured, ap.as_dict(5))
    assert ap.unplanned and all(u.why for u in ap.unplanned)
    whole = peakcut.measure(placed, trained, batch, repeats=1).peak_bytes    # the public measure too
    assert abs(whole - ap.needed_bytes) <= 0.01 * ap.needed_bytes, (whole, ap.as_dict(5))
    # and eager PyTorch's numbers, to the rounding of the plan's split reductions
    tol = tolerance(torch.float32, batch[0].numel(), STEPS)
    report = peakcut.check_equivalence(model, batch, loss_fn, SPEC, lambda _m: Step(g, order, arena=True),
                                       steps=STEPS, rtol=tol, atol=tol)
    assert report.ok, report
