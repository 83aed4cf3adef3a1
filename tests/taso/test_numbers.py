"""The committed rules give the same numbers on real tensors: each side of a sample of rules
runs as its ATen calls (peakcut.taso.calls) at random sizes, in float64 within the rounding
tolerance, and rules marked float_exact without GELU bit for bit in float32."""

from __future__ import annotations

import random
from typing import Any

import torch

from peakcut.taso import load
from peakcut.taso.calls import calls, run
from peakcut.taso.ops import dim_size
from peakcut.taso.term import text
from tests.tolerance import tolerance

SAMPLE = 500


def _aten(name: str) -> Any:
    _, op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def test_rules_keep_the_numbers_on_real_tensors() -> None:
    rules = load().rules
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for rule in rng.sample(list(rules), SAMPLE):
        sizes = {t: rng.randint(1, 5) for t in ("m", "n", "k")}
        exact = rule.float_exact and "gelu" not in text(rule.src) + text(rule.dst)
        dtype = torch.float32 if exact else torch.float64
        tensors = {name: torch.randn([dim_size(d, sizes) for d in shape], generator=gen, dtype=dtype)
                   for name, shape in rule.inputs.items()}
        a = run(calls(rule.src, rule.inputs, sizes), tensors, _aten)
        b = run(calls(rule.dst, rule.inputs, sizes), tensors, _aten)
        assert a.shape == b.shape, rule.describe()
        if exact:
            assert torch.equal(a, b), rule.describe()
        else:
            tol = tolerance(dtype, 3 * max(sizes.values()) ** 2)
            scale = max(1.0, float(a.abs().max()) if a.numel() else 1.0)
            assert torch.allclose(a, b, rtol=tol, atol=tol * scale), f"{rule.describe()} at {sizes}"
