"""Every kind of tensor a user may hand to a step gets a clear answer: supported with eager's
numbers, or a peakcut.CaptureError (at capture) / StepBindingError (at plan.step) that names
the argument (the batch leaf's pytree path, the parameter's name) and its kind. After every
refusal the parameters and the optimizer state are as they were."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import peakcut
from peakcut.codegen import StepBindingError
from tests.helpers import cross_entropy_loss, make_mlp
from tests.tolerance import tolerance

FAST = {"device": "h200", "time_budget": 0.5}


class GCN(nn.Module):
    """One graph convolution: torch.sparse.mm with the adjacency of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adj, self.fc(x))


def gcn_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, adj, y = batch
    return F.cross_entropy(model(x, adj), y)


class Tagged(torch.Tensor):
    """A user's tensor subclass."""


class TaggedParameter(nn.Parameter):
    """A user's parameter subclass."""


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers(), *state)]


def _with_state(model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], torch.Tensor]
                ) -> torch.optim.Optimizer:
    """AdamW with one eager step in (so there is state to leave alone)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    loss(model, batch).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def _refused(model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], torch.Tensor], match: str,
             good_batch: Any = None) -> None:
    """peakcut.optimize refuses (model, batch) with a CaptureError matching `match` and leaves
    the parameters and the AdamW state as they were."""
    opt = _with_state(model, batch if good_batch is None else good_batch, loss)
    before = _snapshot(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # PyTorch's beta/deprecation notes on these kinds
        with pytest.raises(peakcut.CaptureError, match=match):
            peakcut.optimize(model, batch, loss, optimizer=opt, **FAST)
    after = _snapshot(model, opt)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def _graph() -> tuple[GCN, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    adj = (torch.rand(5, 5) < 0.4).float() + torch.eye(5)
    return GCN(), (torch.randn(5, 8), adj, torch.randint(0, 4, (5,)))


@pytest.mark.parametrize(("layout", "kind"), [(torch.sparse_coo, "a sparse COO tensor"),
                                              (torch.sparse_csr, "a sparse CSR tensor")])
def test_a_sparse_adjacency_in_the_batch_is_refused_by_path_and_kind(layout: torch.layout, kind: str) -> None:
    model, (x, adj, y) = _graph()
    sparse = adj.to_sparse() if layout == torch.sparse_coo else adj.to_sparse_csr()
    _refused(model, (x, sparse, y), gcn_loss, rf"batch\[1\] is {kind}", good_batch=(x, sparse, y))


def test_a_nested_tensor_in_a_dict_batch_is_refused_by_its_key() -> None:
    model, (x, y) = make_mlp()
    nested = torch.nested.nested_tensor([x[:2], x[2:]], layout=torch.jagged)

    def loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(m(b["x"]), b["y"])
    opt = _with_state(model, {"x": x, "y": y}, loss)
    before = _snapshot(model, opt)
    with pytest.raises(peakcut.CaptureError, match=r"batch\['x'\] is a nested tensor"):
        peakcut.optimize(model, {"x": nested, "y": y}, loss, optimizer=opt, **FAST)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model, opt), strict=True))


def test_a_quantized_batch_tensor_is_refused() -> None:
    model, (x, y) = make_mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
    _refused(model, (q, y), cross_entropy_loss, r"batch\[0\] is a quantized tensor", good_batch=(x, y))


def test_a_tensor_subclass_in_the_batch_is_refused_by_its_class() -> None:
    model, (x, y) = make_mlp()
    _refused(model, (x.as_subclass(Tagged), y), cross_entropy_loss, r"batch\[0\] is a tensor subclass Tagged",
             good_batch=(x, y))


def test_a_float8_batch_tensor_is_refused_by_dtype() -> None:
    model, (x, y) = make_mlp()
    _refused(model, (x.to(torch.float8_e4m3fn), y), cross_entropy_loss, r"batch\[0\] is a float8_e4m3fn tensor",
             good_batch=(x, y))


def test_a_parameter_subclass_is_refused_by_its_name() -> None:
    model, batch = make_mlp()
    model.fc1.weight = TaggedParameter(model.fc1.weight.detach().clone())
    _refused(model, batch, cross_entropy_loss, r"parameter 'fc1\.weight' of MLP is a tensor subclass TaggedParameter")


def test_an_uninitialized_lazy_parameter_is_refused_by_its_name() -> None:
    model = nn.Sequential(nn.LazyLinear(4))
    with pytest.raises(peakcut.CaptureError, match=r"parameter '0\.weight' of Sequential is an uninitialized"):
        peakcut.capture(model, (torch.randn(3, 8), torch.randint(0, 4, (3,))), cross_entropy_loss, "adamw")


class ComplexInput(nn.Module):
    """Reads a complex batch through view_as_real; `trained` adds a complex weight."""

    def __init__(self, trained: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.w = nn.Parameter(torch.eye(4, dtype=torch.complex64)) if trained else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z * z if self.w is None else z @ self.w
        return self.fc(torch.view_as_real(z).flatten(1))


def test_a_complex_batch_gives_eager_numbers() -> None:
    torch.manual_seed(0)
    model = ComplexInput()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    batches = [(torch.randn(6, 4, dtype=torch.complex64), torch.randint(0, 4, (6,))) for _ in range(3)]
    plan = peakcut.optimize(model, batches[0], cross_entropy_loss, opt, **FAST)
    tol = tolerance(torch.float32, 8, 3)
    for batch in batches:
        expected = cross_entropy_loss(ref, batch)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(plan.step(batch), expected.detach(), rtol=tol, atol=tol)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)


def test_a_complex_parameter_that_trains_is_refused_by_its_name() -> None:
    torch.manual_seed(0)
    batch = (torch.randn(6, 4, dtype=torch.complex64), torch.randint(0, 4, (6,)))
    with pytest.raises(peakcut.CaptureError, match=r"parameter 'w' of ComplexInput is a complex tensor"):
        peakcut.optimize(ComplexInput(trained=True), batch, cross_entropy_loss, "adamw", **FAST)


def test_a_dtensor_in_the_batch_is_refused(tmp_path: Path) -> None:
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of this process yet")
    from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        model, (x, y) = make_mlp()
        dx = distribute_tensor(x, DeviceMesh("cpu", [0]), [Replicate()])
        _refused(model, (dx, y), cross_entropy_loss, r"batch\[0\] is a DTensor", good_batch=(x, y))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("bad", "match"), [
    (lambda x: x.to_sparse(), r"batch\[0\] is a sparse COO tensor"),
    (lambda x: torch.nested.nested_tensor([x[:2], x[2:]]), r"batch\[0\] is a nested tensor"),   # no .shape
    (lambda x: x.as_subclass(Tagged), r"batch\[0\] is a tensor subclass Tagged"),
])
def test_a_later_batch_of_a_bad_kind_is_refused_before_it_runs(bad: Callable[[torch.Tensor], torch.Tensor],
                                                                match: str) -> None:
    model, (x, y) = make_mlp()
    opt = _with_state(model, (x, y), cross_entropy_loss)
    plan = peakcut.optimize(model, (x, y), cross_entropy_loss, opt, **FAST)
    step = peakcut.build(peakcut.capture(model, (x, y), cross_entropy_loss, opt), optimizer=opt)
    before = _snapshot(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrong = (bad(x), y)
        with pytest.raises(StepBindingError, match=match):
            plan.step(wrong)
        with pytest.raises(StepBindingError, match=match):
            step(model, wrong)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model, opt), strict=True))
