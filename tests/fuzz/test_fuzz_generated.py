"""A slice of bench.fuzz --generated: a few generated substitutions in random training steps,
applied by the search's own GeneratedRule, the program against eager for 3 steps; and a
wrong substitution is caught by the same path."""

from __future__ import annotations

import random

from bench.fuzz.generated import LOSS, run_generated_case, search_rule
from bench.fuzz.generated_main import Record, fuzz_generated
from bench.fuzz.generated_model import draw_unit
from peakcut.rules.generated_rule import GeneratedRule
from peakcut.taso import Rule
from peakcut.taso.term import parse

# a transpose pair, a weight gradient's transposes, a matmul merge, a slice of a concatenation,
# a softmax and a reduction under a transpose
SLICE = ("t(t(a)) => a", "t(mm(t(b), a)) => mm(t(a), b)", "add(mm(a, c), mm(a, d)) => mm(a, add(c, d))",
         "slice1a(cat1(a, b)) => a", "t(softmax0(t(a))) => softmax1(a)", "t(sum0(t(a))) => sum1(a)")


def test_a_slice_of_generated_rules_keeps_eager_numbers(tmp_path) -> None:
    rules = search_rule().rules()
    picked = [i for i, r in enumerate(rules) if r.describe().split(": ", 1)[1] in SLICE]
    assert len(picked) == len(SLICE)
    record = Record(2, len(picked), 1, 1, {})
    result = fuzz_generated(picked, cases_per_rule=1, seed=2, units=len(picked), record=record)
    for t in result.tallies.values():
        assert t.cases >= 1 and t.bad == 0, (t.text, t.cases, t.bad, t.missed)
        assert t.worst <= 1.0
    assert not result.not_ok(), [o.detail for o in result.not_ok()]
    # the record: saved and loaded whole; a resumed run finds every rule counted and runs nothing
    assert record.cases == len(result.outcomes) and not record.not_ok
    record.save(tmp_path / "record.json")
    again = Record.load(tmp_path / "record.json")
    assert again.to_json() == record.to_json()
    resumed = fuzz_generated(picked, cases_per_rule=1, seed=2, units=len(picked), record=again)
    assert not resumed.outcomes and resumed.tallies == result.tallies


def test_until_counts_the_cases_other_workers_were_running() -> None:
    """--until with two workers: the case that passes the time ends the run, and the cases the
    pool had started by then end and are counted, not dropped."""
    rules = search_rule().rules()
    picked = [i for i, r in enumerate(rules) if r.describe().split(": ", 1)[1] in SLICE[:4]]
    record = Record(3, 1, 1, 1, {})
    result = fuzz_generated(picked, cases_per_rule=1, seed=3, units=1, jobs=2, record=record, until=0.3)
    assert len(result.outcomes) > 1
    assert record.cases == len(result.outcomes)
    assert sum(t.drawn for t in result.tallies.values()) == len(result.outcomes)


def test_a_wrong_substitution_is_caught() -> None:
    a = (("m",), ("n",))
    wrong = Rule("wrong", parse("neg(neg(a))"), parse("neg(a)"), {"a": a}, float_exact=True)
    rule = GeneratedRule([wrong])
    spec = draw_unit(random.Random(0), 0, wrong)
    out = run_generated_case([spec], seed=1, rule=rule)
    assert out.own == {0}
    assert out.status == "mismatch" and not out.rule_ok(0)
    assert LOSS in out.bad_units or 0 in out.bad_units


def test_a_rule_that_cancels_to_zero_is_judged_under_autocast() -> None:
    """a - (b + a) + b => a + (-a): the source leaves rounding noise where the target computes
    zero, so a bound relative to the values' size is no bound; under bf16 autocast the
    norm-wise judge keeps the float32 judge's absolute floor, and the case is ok."""
    rules = search_rule().rules()
    index = next(i for i, r in enumerate(rules) if r.describe().endswith("add(sub(a, add(b, a)), b) => add(a, neg(a))"))
    out = run_generated_case([draw_unit(random.Random(8), index, rules[index])], seed=8)
    assert out.dtype == "bf16 autocast" and out.own == {0}
    assert out.status == "ok", out.detail


def test_a_gradient_that_is_rounding_noise_is_judged_through_the_optimizer() -> None:
    """sum(softmax(a)) * sum(softmax(a)) => sum(softmax(a)): both are 1, so a's gradient is
    rounding noise in source and target alike, and Adam turns noise into steps of about
    lr x noise / eps. Parameters and optimizer state are allowed what the allowed gradient
    differences do through the user's optimizer (an eager loop nudged by them)."""
    rules = search_rule().rules()
    index = next(i for i, r in enumerate(rules)
                 if r.describe().endswith("mul(sum1(softmax1(a)), sum1(softmax1(a))) => sum1(softmax1(a))"))
    out = run_generated_case([draw_unit(random.Random(19), index, rules[index])], seed=19)
    assert out.dtype == "float64" and out.own == {0}
    assert out.status == "ok", out.detail
