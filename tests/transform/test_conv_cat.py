"""split_conv_cat (peakcut.transform.taso.conv_cat): convolutions over a channel concatenation
run per concatenated tensor. On the tiny U-Net and U-Net++ and on a model with a transposed
convolution, a bias, a three-way cat and a cat holding the image: eager's numbers over 3 AdamW
steps (float64: the forward sums over input channels in partial sums; float32 within the
rounding of its longest reduction), no cat left, a lower simulated peak and the CPU-measured
peak within 5% of the simulated one; the Rewrite's bookkeeping; refusals that name the node;
the rule's sites."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.rules.query import Query
from peakcut.transform.taso.conv_cat import CONV, split_conv_cat, why_not_split_conv_cat
from peakcut.transform.taso.matmul import CAT
from peakcut.transform.taso.tag import TasoTag
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss, in_float64
from tests.tolerance import tolerance
from tests.transform.test_taso import checked

RTOL, ATOL = 1e-7, 1e-9   # float64
KIND = "split_conv_cat"


class TwoReaders(nn.Module):
    """One concatenation read by two convolutions: each backward's input gradient is summed
    with the other's (not sliced), so each is remade whole from its pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 2, 1)
        self.left, self.right = nn.Conv2d(6, 4, 3, padding=1), nn.Conv2d(6, 4, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.cat([torch.relu(self.a(x)), self.b(x)], 1)
        return self.left(c) + self.right(c)


class CatNet(nn.Module):
    """A three-way cat holding the image (no gradient for it) into a convolution with a bias,
    then a cat into a transposed convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.mix = nn.Conv2d(3 + 4 + 4, 5, 3, padding=1)
        self.dec = nn.ConvTranspose2d(5 + 4, 3, 3, padding=1)
        self.head = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.stem(x))
        b = torch.relu(self.up(nn.functional.max_pool2d(a, 2)))
        m = torch.relu(self.mix(torch.cat([x, a, b], 1)))
        return self.head(self.dec(torch.cat([m, a], 1)))


def cat_net(dtype: torch.dtype = torch.float64) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return CatNet().to(dtype), (torch.randn(2, 3, 8, 8, dtype=dtype), torch.randint(0, 4, (2, 8, 8)))


def _problem(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    if name == "catnet":
        model, batch = cat_net()
        return model, batch, cross_entropy_loss
    if name == "two readers":
        torch.manual_seed(0)
        batch = (torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.randint(0, 4, (2, 8, 8)))
        return TwoReaders().double(), batch, cross_entropy_loss
    inst = in_float64(get_workload(name).build("tiny"))
    return inst.model, inst.batch, inst.loss_fn


def _cats(g: peakcut.Graph) -> list[int]:
    return [v for v in g.order if g.nodes[v].op == CAT]


@pytest.mark.parametrize("name", ["unet", "unetpp", "catnet", "two readers"])
def test_every_cat_split_keeps_eager_numbers_and_memory_agreement(name: str) -> None:
    model, batch, loss_fn = _problem(name)
    g = peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True)
    cats = _cats(g)
    assert cats and all(why_not_split_conv_cat(g, g.order, c) is None for c in cats)
    rw = checked(g, g.order, split_conv_cat(g, g.order, cats), full=True)
    h, order = rw.graph, rw.order
    assert not set(cats) & set(h.nodes)
    left = ("_grad_weight", "_grad_input") if name == "two readers" else ("_grad_weight",)
    assert all(h.nodes[c].name.endswith(left) for c in _cats(h))   # what is left: weight gradients
    before, after = simulate(g, g.order).peak_bytes, simulate(h, order).peak_bytes
    if name != "two readers":   # there each input gradient is made whole again: no less memory
        assert after < before, (before, after)
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                       lambda _m: Step(h, order), steps=3, rtol=RTOL, atol=ATOL)
    assert report.ok, str(report)
    assert {"loss", "grad", "param", "state"} <= report.kinds()
    measured = peakcut.measure(Step(h, order), copy.deepcopy(model), batch, method="cpu-profiler",
                               repeats=1).peak_bytes
    assert abs(after - measured) <= 0.05 * measured, (after, measured)


def test_float32_within_the_rounding_of_the_longest_reduction() -> None:
    model, batch = cat_net(torch.float32)
    g = peakcut.capture(model, batch, cross_entropy_loss, peakcut.AdamW(), keep_grads=True)
    rw = split_conv_cat(g, g.order, _cats(g))
    reduction = max(int(torch.tensor(g.tensors[g.nodes[v].args[1].id].shape[1:]).prod())
                    for v in g.order if g.nodes[v].op == CONV)
    tol = tolerance(torch.float32, reduction, steps=3)
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, cross_entropy_loss, peakcut.AdamW(),
                                       lambda _m: Step(rw.graph, rw.order), steps=3, rtol=tol, atol=tol)
    assert report.ok, str(report)


def test_the_image_gets_no_gradient_and_weight_gradients_keep_their_tensors() -> None:
    model, batch = cat_net()
    g = peakcut.capture(model, batch, cross_entropy_loss, peakcut.AdamW(), keep_grads=True)
    rw = split_conv_cat(g, g.order, _cats(g))
    h = rw.graph
    assert set(g.outputs) == set(h.outputs)      # the parameters' gradients are the same tensors
    (image,) = [t for t in h.inputs if h.tensors[t].role is Role.INPUT and h.tensors[t].dtype == "float64"]
    reads_image = [v for v in h.order if h.nodes[v].op == "aten.convolution_backward.default"
                   and h.nodes[v].args[1].id == image]
    assert len(reads_image) == 2          # the stem's and the mix's piece of the image
    assert all(not h.nodes[v].args[10][0] for v in reads_image)
    parts = [v for v in h.order if (t := h.nodes[v].tags.get(TasoTag)) is not None and t.part is not None]
    assert {h.nodes[v].name for v in parts} >= {"convolution_2_cat0", "convolution_2_cat2"}


def test_refusals_name_the_node() -> None:
    class Other(nn.Module):
        def __init__(self, groups: int = 1) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
            self.mix = nn.Conv2d(8, 4, 3, padding=1, groups=groups)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            c = torch.cat([self.a(x), self.b(x)], 1)
            out = self.mix(c)
            return out + c[:, :4].mean() if self.mix.groups == 1 else out

    torch.manual_seed(0)
    batch = (torch.randn(2, 3, 6, 6), torch.randint(0, 4, (2, 6, 6)))
    for model, words in ((Other(), "only convolutions"), (Other(groups=2), "grouped convolution")):
        g = peakcut.capture(model, batch, cross_entropy_loss, peakcut.AdamW())
        (cat,) = _cats(g)
        reason = why_not_split_conv_cat(g, g.order, cat)
        assert reason is not None and words in reason, reason
        assert "node" in reason
        with pytest.raises(ValueError, match=words):
            split_conv_cat(g, g.order, [cat])
        assert not RULES.rewrite_candidates(g, g.order, kinds=(KIND,))
    g = peakcut.capture(Other(), batch, cross_entropy_loss, peakcut.AdamW())
    conv = next(v for v in g.order if g.nodes[v].op == CONV)
    assert "not a concatenation" in (why_not_split_conv_cat(g, g.order, conv) or "")


def test_rule_sites_all_first_then_most_bytes_first() -> None:
    inst = get_workload("unetpp").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, peakcut.AdamW())
    sites = RULES.rewrite_candidates(g, g.order, limit=100, kinds=(KIND,))
    cats = _cats(g)
    assert {v for v in sites[0].nodes if g.nodes[v].op == CAT} == set(cats) and len(sites) == len(cats) + 1
    # a site names every node it removes (the readers, the gradient slices), so that the search
    # keeps it out of enabled fission regions
    readers = {u for c in cats for u in g.users(g.nodes[c].output_ids()[0])}
    assert readers < set(sites[0].nodes)
    assert any(g.nodes[v].op == "aten.slice.Tensor" for v in sites[1].nodes)
    sizes = [g.tensors[g.nodes[s.nodes[0]].output_ids()[0]].nbytes for s in sites[1:]]
    assert sizes == sorted(sizes, reverse=True)
    rw = RULES.apply_rewrite(g, g.order, sites[1])
    assert sites[1].nodes[0] not in rw.graph.nodes
    assert len([c for c in _cats(rw.graph) if not rw.graph.nodes[c].name.endswith("_grad_weight")]) == len(cats) - 1
    assert "copy goes" in RULES.rewrite_rule(KIND).describe(Query(g, g.order), sites[1])
