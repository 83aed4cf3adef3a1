"""Built steps: running, binding errors, measurement on CPU, fake tracking."""

from __future__ import annotations

import copy

import pytest
import torch

import peakcut
from peakcut.memory import simulate
from tests.conftest import cnn_loss


def test_step_trains_like_eager(small_cnn):
    model, batch = small_cnn
    spec = peakcut.SGD(lr=0.1, momentum=0.9)
    step = peakcut.build(peakcut.capture(model, batch, cnn_loss, spec))
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    for _ in range(2):
        loss = step(model, batch)
        opt.zero_grad()
        ref_loss = cnn_loss(ref, batch)
        ref_loss.backward()
        opt.step()
        assert torch.equal(loss, ref_loss.detach())
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert step.path.exists() and step.path.read_text() == step.source
    assert "def step(" in step.source and "del " in step.source


def test_binding_errors(small_cnn):
    model, batch = small_cnn
    step = peakcut.build(peakcut.capture(model, batch, cnn_loss, "sgd"))
    with pytest.raises(peakcut.StepBindingError, match="batch:0: got shape"):
        step(model, (torch.randn(4, 3, 8, 8), batch[1]))
    with pytest.raises(peakcut.StepBindingError, match="structure"):
        step(model, [batch[0]])
    other = torch.nn.Linear(2, 2)
    with pytest.raises(peakcut.StepBindingError, match="no param named 'conv.weight'"):
        step(other, batch)


def test_measure_cpu_restores_model(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    step = peakcut.build(g)
    before = copy.deepcopy(model.state_dict())
    m = peakcut.measure(step, model, batch)
    assert m.method == "cpu-profiler" and m.peak_bytes > m.input_bytes > 0 and m.seconds > 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert m.input_bytes == simulate(g).baseline_bytes


def test_fake_tracker_agrees_with_simulation(small_cnn):
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "sgd")
    m = peakcut.measure(peakcut.build(g), model, batch, method="fake-tracker")
    assert m.peak_bytes == simulate(g, workspace="cpu-rules").peak_bytes    # the tracker adds the rules


def test_inference_step_returns_model_output(small_cnn):
    model, batch = small_cnn
    model.eval()
    step = peakcut.build(peakcut.capture(model, (batch[0],)))
    out = step(model, (batch[0],))
    with torch.no_grad():
        assert torch.equal(out, model(batch[0]))
