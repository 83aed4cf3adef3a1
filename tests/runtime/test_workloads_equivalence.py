"""Every tiny workload, with SGD and with AdamW: the generated program matches eager PyTorch
(loss, gradients, parameters, optimizer state, buffers) over 3 consecutive steps at fp32
rtol 1e-5 (atol 1e-6)."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.workloads import WORKLOAD_NAMES, get_workload

OPTIMIZERS = {
    "sgd": peakcut.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adamw": peakcut.AdamW(lr=1e-3, weight_decay=1e-2),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_three_steps_match_eager(name: str, optimizer: str) -> None:
    inst = get_workload(name).build("tiny")
    spec = OPTIMIZERS[optimizer]

    def build(model):
        return peakcut.build(peakcut.capture(model, inst.batch, inst.loss_fn, spec, keep_grads=True))

    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, spec, build, steps=3,
                                       rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)
    assert {"loss", "grad", "param", "state"} <= report.kinds()
    if any(True for _ in inst.model.buffers()):
        assert "buffer" in report.kinds()
