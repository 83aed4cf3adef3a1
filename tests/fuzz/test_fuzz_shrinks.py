"""bench.fuzz under hypothesis: the generator draws every choice from st.randoms(), so a
failing case shrinks to a small one (issue 19).

The first test is the fuzz slice again, with hypothesis choosing (derandomized: the same
cases on every machine; a walk can differ where the time-bounded re-ordering of its root
does); were one to fail, hypothesis would report it shrunk. The second
shows what shrinking gives, on a property cheap to check: among the cases with a
layer norm, the one hypothesis shrinks to is a single LayerNorm block, at the smaller
batch, with an optimizer recipe (what exactly it shrinks to may vary between hypothesis
versions; these properties should not).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from bench.fuzz.harness import run_case
from bench.fuzz.models import draw_case

DRAWN = settings(max_examples=12, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


@DRAWN
@given(st.randoms(use_true_random=False))
def test_a_case_hypothesis_draws_keeps_eager_numbers(rng: random.Random) -> None:
    case = draw_case(rng)
    out = run_case(case, moves=rng.randint(0, 3))
    assert out.status == "ok", f"{out.description}; moves {out.steps}\n{out.detail}"


def test_a_failing_case_shrinks_to_a_small_one() -> None:
    shrunk: list[str] = []

    def failing(rng: random.Random) -> bool:
        description = draw_case(rng).description
        if "layernorm" in description:
            shrunk.append(description)
            return True
        return False

    find(st.randoms(use_true_random=False), failing,
         settings=settings(max_examples=300, derandomize=True, database=None))
    smallest = shrunk[-1]
    assert "[layernorm]" in smallest, smallest        # one block: the one that 'fails'
    assert smallest.startswith("seq B2 "), smallest  # the smaller batch
    assert "in groups" not in smallest, smallest      # no user loop: a recipe
