"""bench.measured's number check: where the update is compared (moments_agree)."""

from __future__ import annotations

import torch

from bench.measured.run import moments_agree, number_tolerance


def test_updates_are_compared_where_the_moments_agree() -> None:
    tol = number_tolerance(2)
    ref = {"exp_avg": torch.tensor([1e-3, 1e-9, 2e-4]), "exp_avg_sq": torch.tensor([1e-6, 1e-18, 4e-8])}
    plan = {"exp_avg": torch.tensor([1e-3, -1e-9, 2e-4 * (1 + tol / 2)]),    # a rounding-zero gradient flips
            "exp_avg_sq": torch.tensor([1e-6, 1e-18, 4e-8])}
    assert moments_agree(ref, plan, tol).tolist() == [True, False, True]
    assert moments_agree({}, {}, tol) is None                    # not AdamW: every element compared
    only_first = moments_agree({"exp_avg": ref["exp_avg"]}, {"exp_avg": plan["exp_avg"]}, tol)
    assert only_first.tolist() == [True, False, True]
