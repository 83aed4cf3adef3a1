"""The generator's pipeline on a slice of the enumeration: deterministic, and every step does
what it says (fingerprint-equal candidates, renamed copies dropped, pruning sound)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peakcut.taso.enumeration import enumerate_terms
from peakcut.taso.generate import INPUTS, STEPS, Generated, generate
from peakcut.taso.prune import Renaming, implied_by_common, implied_by_smaller
from peakcut.taso.ruleset import dumps
from peakcut.taso.term import parse, size
from peakcut.taso.verify import Verifier

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2500
DIGEST = ("import hashlib; from peakcut.taso.generate import generate; "
          "from peakcut.taso.ruleset import dumps; "
          f"print(hashlib.sha256(dumps(generate(limit={LIMIT}).rules).encode()).hexdigest())")


@pytest.fixture(scope="module")
def generated() -> Generated:
    return generate(limit=LIMIT)


@pytest.fixture(scope="module")
def small(generated: Generated) -> str:
    return dumps(generated.rules)


def test_regenerating_gives_the_same_set(small: str) -> None:
    assert dumps(generate(limit=LIMIT).rules) == small


def test_the_set_does_not_depend_on_hash_order(small: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == hashlib.sha256(small.encode()).hexdigest()


def test_counts_shrink_step_by_step(generated: Generated) -> None:
    g = generated
    counts = [g.counts[s] for s in STEPS]
    assert counts[0] == LIMIT
    assert all(a >= b for a, b in zip(counts[1:], counts[2:], strict=False)), counts
    assert len(g.rules.rules) == g.counts["after pruning"] > 0


def test_enumeration_is_small_graphs_without_duplicates() -> None:
    e = enumerate_terms(INPUTS, max_ops=2)
    assert len(set(e.terms)) == len(e.terms)
    assert {size(t) for t in e.terms} == {1, 2}
    assert parse("mm(a, c)") in e.terms and parse("t(mm(a, c))") in e.terms
    assert parse("mm(c, a)") not in e.terms          # shapes do not fit
    assert parse("sub(a, a)") not in e.terms         # identically zero: no useful rule


def test_renaming_and_direction_share_a_key() -> None:
    r = Renaming(INPUTS)
    assert r.key(parse("add(a, b)"), parse("add(b, a)")) == r.key(parse("add(d, c)"), parse("add(c, d)"))
    assert r.key(parse("t(t(a))"), parse("a")) == r.key(parse("c"), parse("t(t(c))"))
    assert r.key(parse("mm(a, c)"), parse("a")) != r.key(parse("add(a, b)"), parse("a"))


def test_pruning_finds_what_implies_a_rule() -> None:
    prove = lambda s, d: Verifier(INPUTS).prove(s, d).proved  # noqa: E731
    assert implied_by_smaller(parse("relu(t(t(a)))"), parse("relu(a)"), prove)
    assert not implied_by_smaller(parse("t(mm(a, c))"), parse("mm(t(c), t(a))"), prove)
    assert implied_by_common(parse("add(relu(a), b)"), parse("add(b, relu(a))"), INPUTS)
    assert not implied_by_common(parse("relu(relu(a))"), parse("relu(a)"), INPUTS)
