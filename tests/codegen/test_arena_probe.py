"""Which calls write into a given place: out overloads found by their schema, and an out
overload that computes elsewhere and copies detected by the probe (so its result stays
outside the arena, listed with why), while one that writes in place is placed."""

from __future__ import annotations

import torch
from torch import nn

import peakcut
from peakcut.codegen.arena_probe import COPIES
from peakcut.codegen.out_variants import out_variant
from peakcut.codegen.program import Step

LIB = torch.library.Library("peakcut_arena_test", "DEF")     # (test ops: the module's own namespace)
LIB.define("copied(Tensor x) -> Tensor")
LIB.define("copied.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
LIB.define("direct(Tensor x) -> Tensor")
LIB.define("direct.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")


def _copied_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    out.copy_(x * 2)                         # made elsewhere, then copied: no placement
    return out


def _direct_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    torch.mul(x, 3, out=out)                 # written where it is given
    return out


LIB.impl("copied", lambda x: x * 2, "CPU")
LIB.impl("copied.out", _copied_out, "CPU")
LIB.impl("direct", lambda x: x * 3, "CPU")
LIB.impl("direct.out", _direct_out, "CPU")
for _name in ("copied", "direct"):
    LIB.impl(_name, lambda x: torch.empty_like(x), "Meta")


class Uses(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.peakcut_arena_test
        return ops.direct(ops.copied(x.sin())).cos().sum()


def test_out_variants_are_found_by_schema():
    assert out_variant("aten.mm.default").target == "aten.mm.out"
    assert out_variant("aten.sum.dim_IntList").target == "aten.sum.IntList_out"
    assert out_variant("aten.native_layer_norm.default").names == ("out0", "out1", "out2")
    assert out_variant("aten.clone.default").method == "copy_"           # an in-place form
    assert out_variant("aten.view.default") is None                       # a view: no result to place
    assert out_variant("aten.add_.Tensor") is None                        # in place already
    assert out_variant("nosuch.op.default") is None


def test_an_out_overload_that_copies_is_no_placement():
    x = torch.randn(32, 32)
    g = peakcut.capture(Uses(), (x,), None, None)
    rng = torch.get_rng_state()
    step = Step(g, arena=True)
    assert torch.equal(torch.get_rng_state(), rng)      # the probes' random inputs leave the caller's RNG
    ap = step.arena_plan
    ops = {g.nodes[n].op for n in ap.placed}
    assert "peakcut_arena_test.direct.default" in ops and "aten.sin.default" in ops
    (copied,) = [u for u in ap.unplanned if u.op == "peakcut_arena_test.copied.default"]
    assert copied.why == COPIES and copied.bytes == x.numel() * 4
    assert "torch.ops.peakcut_arena_test.direct.out(" in step.source
    assert "torch.ops.peakcut_arena_test.copied.default(" in step.source
    assert torch.equal(step(Uses(), (x,)), Uses()(x))
