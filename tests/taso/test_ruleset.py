"""The committed rule set (src/peakcut/taso/rules.json): it loads, is large enough, carries its
version, and its rules are proved again here (a deterministic sample: the whole set takes
longer than a test should)."""

from __future__ import annotations

import pytest

from peakcut.taso import load
from peakcut.taso.ruleset import VERSION, dumps, loads
from peakcut.taso.term import input_names
from peakcut.taso.verify import Verifier

SAMPLE = 400


@pytest.fixture(scope="module")
def text() -> str:
    from importlib import resources
    return resources.files("peakcut.taso").joinpath("rules.json").read_text()


def test_committed_set_loads_with_its_version(text: str) -> None:
    rs = load()
    assert rs.version == VERSION
    assert len(rs.rules) >= 200
    assert len({r.name for r in rs.rules}) == len(rs.rules)
    assert rs.counts["after pruning"] == len(rs.rules)
    assert rs.generator["command"] == "python -m bench.taso"
    assert dumps(loads(text)) == text                 # the format reads back to the same bytes


def test_a_sample_of_the_committed_rules_verifies_again() -> None:
    rs = load()
    step = max(1, len(rs.rules) // SAMPLE)
    verifiers: dict[tuple[object, ...], Verifier] = {}
    for rule in rs.rules[::step]:
        key = tuple(sorted(rule.inputs.items()))
        v = verifiers.setdefault(key, Verifier(rule.inputs))
        verdict = v.prove(rule.src, rule.dst)
        assert verdict.proved, f"{rule.describe()}: {verdict.reason}"
        assert set(input_names(rule.dst)) <= set(input_names(rule.src))


def test_a_wrong_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version 99"):
        loads('{"version": 99, "rules": []}', "x.json")
    with pytest.raises(ValueError, match="not JSON"):
        loads("{", "x.json")
