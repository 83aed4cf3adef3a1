"""A fixed-seed slice of bench.fuzz: random training steps, random moves of every rule,
the generated program against eager for 3 steps."""

from __future__ import annotations

import pytest

from bench.fuzz.harness import run_case
from bench.fuzz.models import make_case
from bench.fuzz.user_code import FEATURES

SEEDS = range(50)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_step_through_random_rules_keeps_eager_numbers(seed: int) -> None:
    out = run_case(make_case(seed), moves=3)
    assert out.status == "ok", f"seed {seed}: {out.description}; moves {out.steps}\n{out.detail}"


def test_the_same_seed_makes_the_same_case() -> None:
    a, b = make_case(7), make_case(7)
    assert a.description == b.description
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert p.equal(q)
    assert all(x.equal(y) for x, y in zip(a.batch, b.batch, strict=True))


def test_the_slice_holds_every_kind_of_user_code() -> None:
    """Checkpointed dropout in both modes, hooks, closed-over tensors and tensors made on the
    fly all occur among the slice's cases."""
    seen = {tag for seed in SEEDS for tag in make_case(seed).tags}
    assert set(FEATURES) <= seen, sorted(set(FEATURES) - seen)
