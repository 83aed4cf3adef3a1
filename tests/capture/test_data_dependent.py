"""Data-dependent sizes specialised at capture and guarded at run time; sparse matrices built
in the step captured over their parts and priced.

The models are a 2-layer GCN-like network over a 40-vertex graph (tiny: each test captures
in well under a second). Numbers are compared with eager at float32's tolerance for sums of
the feature width and a vertex's in-edges (at most 240), over 3 Adam steps.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.capture import CaptureError, capture
from peakcut.codegen.program import StepBindingError
from peakcut.cost.model import get_cost_model
from peakcut.ir.guards import NONZERO_COUNTED_OP, SpecializationError
from peakcut.ir.registry import flops
from peakcut.ir.sparse_ops import SPMM_OP
from tests.helpers import step_against_eager
from tests.tolerance import tolerance

V, E, FEATURES, CLASSES = 40, 240, 6, 3
TOL = tolerance(torch.float32, E, 3)


def graph(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, src, dst, labels, train_mask) of a random graph."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, V, (E,), generator=gen), torch.randint(0, V, (E,), generator=gen)
    return (torch.randn(V, FEATURES, generator=gen), src, dst, torch.randint(0, CLASSES, (V,), generator=gen),
            torch.rand(V, generator=gen) < 0.5)


class EdgeNet(nn.Module):
    """Sum over in-edges, then a linear layer, twice. With `drop_loops`, self-loops are dropped
    first with a boolean mask over the edges (what PyG's default GCNConv does)."""

    def __init__(self, drop_loops: bool = False) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(FEATURES, 8), nn.Linear(8, CLASSES)
        self.drop_loops = drop_loops

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        if self.drop_loops:
            keep = torch.nonzero(src != dst).squeeze(1)
            src, dst = src[keep], dst[keep]

        def agg(h: torch.Tensor) -> torch.Tensor:
            return h + torch.zeros_like(h).index_add_(0, dst, h.index_select(0, src))
        return self.lin2(F.relu(self.lin1(agg(x))))


def indexed_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, src, dst, labels, mask = batch
    return F.cross_entropy(model(x, src, dst)[mask], labels[mask])


def selected_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, src, dst, labels, mask = batch
    logp = F.log_softmax(model(x, src, dst), 1).gather(1, labels.unsqueeze(1)).squeeze(1)
    return -torch.masked_select(logp, mask).mean()


def run_both(model: nn.Module, loss_fn, batches, replan: bool = True) -> tuple[peakcut.Plan, list[str]]:
    """Plan on batches[0], then step plan and eager on each batch; compare every loss and the end state."""
    ref = copy.deepcopy(model)
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, batches[0], loss_fn, opt, device="cpu", time_budget=0.5, max_states=2,
                            replan=replan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_against_eager(plan, model, opt, ref, ref_opt, loss_fn, batches, TOL)
    return plan, [str(w.message) for w in caught if "peakcut" in str(w.message)]


def test_boolean_mask_in_the_loss_is_specialised_and_guarded() -> None:
    batch = graph()
    g = capture(EdgeNet(), batch, indexed_loss, "adam")
    guards = [n for n in g.nodes.values() if n.op == NONZERO_COUNTED_OP]
    assert len(guards) == 3            # out[mask], labels[mask], and the gradient's index_put
    assert all(n.args[1] == int(batch[4].sum()) for n in guards)
    assert any("specialised" in note for note in g.signature.notes)


def test_a_changed_count_plans_again_and_a_known_one_is_reused() -> None:
    a = graph()
    mask = a[4].clone()
    mask[:3] = ~mask[:3]
    b = (*a[:4], mask)
    same_count = (*a[:4], a[4].roll(1))
    plan, notes = run_both(EdgeNet(), indexed_loss, [a, b, a, b, same_count])
    assert sum("planned again" in n for n in notes) == 1 and "aten.index.Tensor" in notes[0]
    del plan


def test_without_replan_a_changed_count_is_refused_naming_the_op() -> None:
    a = graph()
    model = EdgeNet()
    plan = peakcut.optimize(model, a, indexed_loss, "adam", device="cpu", time_budget=0.5, max_states=2,
                            replan=False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(StepBindingError, match=r"aten\.index\.Tensor.*specialised to \d+") as err:
        plan.step((*a[:4], torch.ones(V, dtype=torch.bool)))
    assert isinstance(err.value.__cause__, SpecializationError)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))   # nothing updated


def test_nonzero_in_the_forward_and_masked_select() -> None:
    a, b = graph(0), graph(1)
    run_both(EdgeNet(drop_loops=True), selected_loss, [a, b])


def test_meta_batch_cannot_be_specialised() -> None:
    batch = tuple(t.to("meta") for t in graph())
    with torch.device("meta"):
        model = EdgeNet()
    with pytest.raises(CaptureError, match="meta device.*mask-weighted loss"):
        capture(model, batch, indexed_loss, "adam", device="cpu")


class SparseNet(nn.Module):
    """Linear, then a product with the graph's adjacency as a sparse COO or CSR matrix."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, CLASSES)
        self.layout = layout

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        values = torch.full(src.shape, 0.1)
        if self.layout == "coo":
            adj = torch.sparse_coo_tensor(torch.stack([dst, src]), values, (V, V)).coalesce()
        else:
            order = torch.argsort(dst * V + src)
            counts = torch.zeros(V, dtype=torch.int64).index_add_(0, dst, torch.ones_like(dst))
            crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            adj = torch.sparse_csr_tensor(crow, src[order], values, (V, V))
        return torch.sparse.mm(adj, self.lin(x)) + adj.t() @ x[:, :CLASSES]


def full_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, src, dst, labels, _ = batch
    return F.cross_entropy(model(x, src, dst), labels)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_mm_captures_and_gives_eager_numbers(layout: str) -> None:
    batch = graph()
    g = capture(SparseNet(layout), batch, full_loss, "adam")
    spmm = [n for n in g.nodes.values() if n.op == SPMM_OP]
    assert len(spmm) == 3          # A @ lin(x), A.t() @ x, and the gradient A.t() @ grad
    assert not any(t.role.value == "activation" and t.shape == (E, CLASSES) for t in g.tensors.values())
    run_both(SparseNet(layout), full_loss, [batch, batch, batch])


def test_sparse_mm_is_priced_by_its_stored_elements() -> None:
    g = capture(SparseNet("coo"), graph(), full_loss, "adam")
    node = next(n for n in g.nodes.values() if n.op == SPMM_OP)
    args = tuple(g.tensors[a.id].to_meta() if hasattr(a, "id") else a for a in node.args)
    assert flops(node.op, args, {}, [None]) == 2 * E * CLASSES
    assert get_cost_model("h100").node_seconds(g, node.id) > 0


def test_other_uses_of_a_sparse_matrix_are_refused() -> None:
    class Dense(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(FEATURES, CLASSES)

        def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
            adj = torch.sparse_coo_tensor(torch.stack([dst, src]), torch.ones(E), (V, V))
            return self.lin(adj.to_dense() @ x)

    with pytest.raises(CaptureError, match="to_dense.*torch.sparse.mm"):
        capture(Dense(), graph(), full_loss, "adam")


def test_a_sparse_batch_tensor_is_refused_saying_what_to_do() -> None:
    x, src, dst, labels, _ = graph()
    adj = torch.sparse_coo_tensor(torch.stack([dst, src]), torch.ones(E), (V, V))
    with pytest.raises(CaptureError, match=r"batch\[1\] is a sparse COO tensor.*torch\.sparse_coo_tensor\(indices"):
        capture(nn.Linear(FEATURES, CLASSES), (x, adj, labels),
                lambda m, b: F.cross_entropy(torch.sparse.mm(b[1], m(b[0])), b[2]), "adam")
