"""Capture: modes, roles, in-place updates, module attribution, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.ir import Phase, Role
from tests.conftest import cnn_loss


@torch.library.custom_op("peakcut_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    """An op peakcut's registry has never heard of."""
    return x * 2 + 1


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class WithMystery(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(mystery(x))


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow
            return x
        return -x


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x))


def test_training_step_structure(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "sgd")
    assert g.output_names == ["loss"]
    assert {n.phase for n in g.nodes.values()} == set(Phase)
    names = g.input_names
    assert names[0] == "param:conv.weight"
    assert "buffer:bn.running_mean" in names and "state:fc.weight.momentum_buffer" in names
    modules = {n.module for n in g.nodes.values() if n.phase is Phase.FORWARD}
    assert {"conv", "bn", "fc", "ln"} <= modules
    backward_modules = {n.module for n in g.nodes.values() if n.phase is Phase.BACKWARD}
    assert {"conv", "bn", "fc", "ln"} <= backward_modules


def test_parameters_are_updated_in_their_own_storage(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    param_storage = {g.tensors[t].storage: n for t, n in zip(g.inputs, g.input_names, strict=True)
                     if n.startswith("param:")}
    written = {g.tensors[t].storage for nid in g.nodes for t in g.mutated_tensors(nid)
               if g.nodes[nid].phase is Phase.OPTIMIZER}
    assert set(param_storage) <= written  # every parameter is updated in place
    # every reader of a parameter runs before the parameter's first update (control edges)
    pos = {nid: i for i, nid in enumerate(g.order)}
    for s in param_storage:
        writes = [pos[n] for n in g.nodes for t in g.mutated_tensors(n) if g.tensors[t].storage == s]
        first_write = min(writes)
        for nid, node in g.nodes.items():
            reads = any(g.tensors[t].storage == s for t in node.input_ids())
            if reads and node.phase is not Phase.OPTIMIZER:
                assert pos[nid] < first_write


def test_batchnorm_statistics_are_mutations(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "sgd")
    bn = next(n for n in g.nodes.values() if n.op == "aten.native_batch_norm.default")
    written = {g.tensors[t].name for t in g.mutated_tensors(bn.id)}
    assert written == {"buffer:bn.running_mean", "buffer:bn.running_var"}


def test_grad_and_inference_modes(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, None)
    assert g.output_names[0] == "loss" and all(n.startswith("grad:") for n in g.output_names[1:])
    assert all(g.tensors[t].role is Role.GRAD for t in g.outputs[1:])
    inf = peakcut.capture(model.eval(), (batch[0],))
    assert inf.signature.mode == "inference" and inf.output_names == ["out:0"]
    assert all(n.phase in (Phase.FORWARD, Phase.LOSS) for n in inf.nodes.values())


def test_optimizer_from_torch_instance(small_cnn):
    model, batch = small_cnn
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = peakcut.capture(model, batch, cnn_loss, opt)
    (group,) = g.signature.optimizer["groups"]
    assert g.signature.optimizer["kind"] == "adamw"
    assert group["hyper"]["lr"] == 3e-4 and group["hyper"]["weight_decay"] == 0.1
    assert list(group["params"]) == [n for n, _ in model.named_parameters()]
    with pytest.raises(ValueError, match="capturable=True is not supported"):
        peakcut.capture(model, batch, cnn_loss, torch.optim.Adam(model.parameters(), capturable=True))


def test_unknown_op_runs_as_opaque():
    torch.manual_seed(0)
    model = WithMystery()
    batch = (torch.randn(3, 4),)
    loss_fn = lambda m, b: m(b[0]).square().mean()  # noqa: E731
    g = peakcut.capture(model, batch, loss_fn, "sgd")
    opaque = [g.nodes[n].op for n in g.nodes if g.is_opaque(n)]
    assert opaque == ["peakcut_test.mystery.default"]
    report = peakcut.check_equivalence(
        model, batch, loss_fn, peakcut.SGD(lr=0.1, momentum=0.9),
        lambda m: peakcut.build(peakcut.capture(m, batch, loss_fn, peakcut.SGD(lr=0.1, momentum=0.9), keep_grads=True)),
    )
    assert report.ok, str(report)
    assert "torch.ops.peakcut_test.mystery.default" in peakcut.build(g).source


def test_untraceable_model_names_module_and_cause():
    model = Gated()
    with pytest.raises(peakcut.CaptureError) as info:
        peakcut.capture(model, (torch.randn(2, 4),), lambda m, b: m(b[0]).sum(), "sgd")
    message = str(info.value)
    assert "module 'gate' (Gate)" in message
    assert "data-dependent" in message


def test_an_op_without_a_shape_rule_is_named_as_such() -> None:
    """ctc_loss has no FakeTensor shape rule: the message says so instead of blaming .item()."""
    model = nn.Linear(8, 6)
    batch = (torch.randn(2, 10, 8), torch.randint(1, 6, (2, 4)))

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        log_probs = m(b[0]).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, b[1], torch.full((2,), 10), torch.full((2,), 4))

    with pytest.raises(peakcut.CaptureError, match=r"_ctc_loss.*shape PyTorch's FakeTensor cannot tell"):
        peakcut.capture(model, batch, loss_fn, "sgd")


def test_a_cumulative_batch_norm_gets_a_hint() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.Flatten(), nn.Linear(144, 3))
    batch = (torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,)))
    with pytest.raises(peakcut.CaptureError, match=r"module '1' \(BatchNorm2d\).*momentum=None"):
        peakcut.capture(model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), "sgd")


def test_bad_arguments():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="nn.Module"):
        peakcut.capture("not a model", (torch.randn(1, 2),))
    with pytest.raises(ValueError, match="optimizer='rmsprop'"):
        peakcut.capture(model, (torch.randn(1, 2),), lambda m, b: m(b[0]).sum(), "rmsprop")
    with pytest.raises(ValueError, match="needs a loss_fn"):
        peakcut.capture(model, (torch.randn(1, 2),), None, "sgd")
    with pytest.raises(TypeError, match="batch leaf 1"):
        peakcut.capture(model, (torch.randn(1, 2), "text"))
    with pytest.raises(peakcut.CaptureError, match="scalar"):
        peakcut.capture(model, (torch.randn(3, 2),), lambda m, b: m(b[0]), "sgd")


def test_paper_size_model_on_meta_captures_without_memory():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096))
        batch = (torch.empty(512, 4096),)
    g = peakcut.capture(model, batch, lambda m, b: m(b[0]).mean(), "adamw")
    assert g.device == "cpu"
    assert g.param_bytes() == sum(p.numel() * 4 for p in model.parameters())


class PartlyUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_parameters_without_gradient_get_no_state_and_no_update():
    torch.manual_seed(0)
    model, batch = PartlyUsed(), (torch.randn(3, 4),)
    loss_fn = lambda m, b: m(b[0]).square().mean()  # noqa: E731
    spec = peakcut.AdamW(lr=0.1)
    g = peakcut.capture(model, batch, loss_fn, spec)
    assert not [n for n in g.input_names if n.startswith("state:unused")]
    report = peakcut.check_equivalence(
        model, batch, loss_fn, spec, lambda m: peakcut.build(peakcut.capture(m, batch, loss_fn, spec, keep_grads=True)))
    assert report.ok, str(report)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_target_without_cuda_is_a_clear_error():
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="no usable CUDA device"):
        peakcut.capture(model, (torch.empty(2, 4, device="meta"),), lambda m, b: m(b[0]).sum(), "sgd", device="cuda")
