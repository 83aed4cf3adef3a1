"""Tests for peakcut.workloads: tiny sizes run on CPU, paper sizes build on meta."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from peakcut.workloads import (
    ALL_WORKLOAD_NAMES,
    WORKLOAD_NAMES,
    Workload,
    WorkloadInstance,
    get_workload,
    list_workloads,
)

# Published parameter counts (U-Net / U-Net++: this project's paper-size configs, see unet.py).
PAPER_PARAMS = {
    "resnet50": 25.6e6,
    "bert-base": 110e6,
    "vit-base": 86e6,
    "unet": 31.0e6,
    "unetpp": 9.04e6,
    "gpt-neo-1.3b": 1.3e9,
    "btlm-3b": 2.6e9,
}
PAPER_DTYPES = {
    "resnet50": torch.float32,
    "bert-base": torch.float32,
    "vit-base": torch.float32,
    "unet": torch.float32,
    "unetpp": torch.float32,
    "gpt-neo-1.3b": torch.bfloat16,
    "btlm-3b": torch.bfloat16,
}
PAPER_BATCH = {
    "resnet50": 64,
    "bert-base": 32,
    "vit-base": 64,
    "unet": 32,
    "unetpp": 16,
    "gpt-neo-1.3b": 32,
    "btlm-3b": 32,
    "llama2-7b": 8,     # the LLMs of issue 17: tests/workloads/test_llm_workloads.py
    "gpt2-xl": 16,
}
LANGUAGE_MODELS = ("bert-base", "gpt-neo-1.3b", "btlm-3b")


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _loss(inst: WorkloadInstance) -> torch.Tensor:
    return inst.loss_fn(inst.model, inst.batch)


class _Bound(nn.Module):
    """Calls ``model`` with substituted parameters/buffers (as the capture step does)."""

    def __init__(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._model = model
        self._state = state

    def forward(self, *args, **kwargs):
        return functional_call(self._model, self._state, args, kwargs)


def test_names_in_table_order() -> None:
    assert WORKLOAD_NAMES == (
        "resnet50",
        "bert-base",
        "vit-base",
        "unet",
        "unetpp",
        "gpt-neo-1.3b",
        "btlm-3b",
    )
    assert [w.name for w in list_workloads()] == list(ALL_WORKLOAD_NAMES)   # Table 2, then the LLMs
    for w in list_workloads():
        assert isinstance(w, Workload)
        assert w.summary and "\n" not in w.summary
        assert w.paper["batch"] == PAPER_BATCH[w.name]
        assert get_workload(w.name) is w


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        get_workload("resnet-9000")
    for name in WORKLOAD_NAMES:
        assert name in str(err.value)


def test_unknown_size() -> None:
    with pytest.raises(ValueError, match="paper"):
        get_workload("resnet50").build("huge")


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_tiny_forward_backward(name: str) -> None:
    inst = get_workload(name).build("tiny")
    assert inst.name == name and inst.size == "tiny"
    assert inst.dtype == torch.float32
    assert inst.model.training
    assert inst.batch_size == get_workload(name).tiny["batch"] == inst.batch[0].shape[0]
    assert inst.description and "\n" not in inst.description
    assert all(t.device.type == "cpu" for t in inst.batch)
    labels = inst.batch[-1]
    assert labels.dtype == torch.int64

    loss = _loss(inst)
    loss.backward()
    assert loss.shape == () and torch.isfinite(loss)
    for pname, p in inst.model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_dropout_is_off(name: str) -> None:
    model = get_workload(name).build("tiny").model
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))


@pytest.mark.parametrize("name", LANGUAGE_MODELS)
def test_language_model_inputs(name: str) -> None:
    input_ids, attention_mask, labels = get_workload(name).build("tiny").batch
    assert input_ids.dtype == attention_mask.dtype == labels.dtype == torch.int64
    assert input_ids.shape == attention_mask.shape == labels.shape
    assert bool((attention_mask == 1).all())


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_tiny_is_deterministic(name: str) -> None:
    workload = get_workload(name)
    a, b = workload.build("tiny", seed=3), workload.build("tiny", seed=3)
    for x, y in zip(a.batch, b.batch, strict=True):
        assert torch.equal(x, y)
    for (na, pa), (nb, pb) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert na == nb and torch.equal(pa, pb), na
    assert torch.equal(_loss(a), _loss(b))
    c = workload.build("tiny", seed=4)
    assert not torch.equal(_loss(a), _loss(c))


def test_build_does_not_touch_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    get_workload("btlm-3b").build("tiny", seed=7)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_batch_size_override(name: str) -> None:
    inst = get_workload(name).build("tiny", batch_size=3)
    assert inst.batch_size == 3
    assert all(t.shape[0] == 3 for t in inst.batch)
    assert torch.isfinite(_loss(inst))
    paper = get_workload(name).build("paper", batch_size=5)
    assert paper.batch_size == 5 and all(t.shape[0] == 5 for t in paper.batch)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_tiny_traces_with_fake_tensors(name: str) -> None:
    """Loss + grads trace with make_fx(tracing_mode="fake") through functional_call."""
    inst = get_workload(name).build("tiny")
    model = inst.model
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]

    def step(params, buffers, batch):
        ps = [p.detach().requires_grad_() for p in params]
        state = dict(zip(pnames, ps, strict=True)) | dict(zip(bnames, buffers, strict=True))
        loss = inst.loss_fn(_Bound(model, state), tuple(batch))
        return (loss, *torch.autograd.grad(loss, ps))

    args = (
        [p.detach() for p in model.parameters()],
        list(model.buffers()),
        list(inst.batch),
    )
    graph = make_fx(step, tracing_mode="fake")(*args)
    outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == 1 + len(pnames)
    assert outputs[0].meta["val"].shape == ()


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_paper_builds_on_meta(name: str) -> None:
    workload = get_workload(name)
    start = time.perf_counter()
    inst = workload.build("paper")
    assert time.perf_counter() - start < 30.0  # generous: the machine may be shared
    assert inst.size == "paper" and inst.model.training
    assert inst.dtype == PAPER_DTYPES[name]
    assert inst.batch_size == PAPER_BATCH[name] == inst.batch[0].shape[0]
    tensors = [*inst.model.parameters(), *inst.model.buffers(), *inst.batch]
    assert all(t.device.type == "meta" for t in tensors)
    assert all(p.dtype == inst.dtype for p in inst.model.parameters())
    for t in inst.batch:
        assert t.dtype == (inst.dtype if t.is_floating_point() else torch.int64)
    count = _param_count(inst.model)
    assert count == pytest.approx(PAPER_PARAMS[name], rel=0.03), count


def test_a_device_builds_real_tensors_there_at_any_size() -> None:
    """build(..., device=) is how a paper-size step is made on a GPU (bench.gpu): real,
    seeded tensors on that device; the CPU gives the default's values, meta none."""
    workload = get_workload("resnet50")
    default, cpu = workload.build("tiny", seed=5), workload.build("tiny", seed=5, device="cpu")
    for a, b in zip([*default.model.parameters(), *default.batch], [*cpu.model.parameters(), *cpu.batch], strict=True):
        assert torch.equal(a, b)
    meta = workload.build("tiny", device="meta")
    assert all(t.device.type == "meta" for t in [*meta.model.parameters(), *meta.batch])
    paper = workload.build("paper", batch_size=1, device="cpu")
    assert all(t.device.type == "cpu" for t in [*paper.model.parameters(), *paper.batch])
    assert paper.batch[0].shape == (1, 3, 224, 224) and torch.isfinite(_loss(paper))


def test_paper_input_shapes() -> None:
    image = {"resnet50": 224, "vit-base": 224, "unet": 256, "unetpp": 256}
    for name, side in image.items():
        images, labels = get_workload(name).build("paper").batch
        assert tuple(images.shape[1:]) == (3, side, side)
        assert labels.dtype == torch.int64
    for name in LANGUAGE_MODELS:
        input_ids = get_workload(name).build("paper").batch[0]
        assert tuple(input_ids.shape) == (PAPER_BATCH[name], 512)


MEDIUM_INPUT = {
    "resnet50": (8, 3, 224, 224), "bert-base": (4, 128), "vit-base": (4, 3, 224, 224),
    "unet": (6, 3, 128, 128), "unetpp": (8, 3, 128, 128), "gpt-neo-1.3b": (1, 128), "btlm-3b": (1, 128),
}


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_medium_is_the_paper_architecture_at_a_cpu_sized_batch(name: str) -> None:
    """Built on the meta device here (a real medium step holds 1-6 GB; bench.measured runs them)."""
    workload = get_workload(name)
    facts = workload.facts("medium")
    with torch.device("meta"):
        model, batch = workload.make("medium", int(facts["batch"]))
    assert tuple(batch[0].shape) == MEDIUM_INPUT[name]
    count = _param_count(model)
    layers = facts.get("layers")
    if layers is None:     # the paper network itself
        assert count == pytest.approx(PAPER_PARAMS[name], rel=0.03), count
    else:                  # the paper's widths and vocabulary, fewer layers
        assert count < PAPER_PARAMS[name] / 4
    assert facts["params"].rstrip("M") == f"{count / 1e6:.0f}" or layers is None
