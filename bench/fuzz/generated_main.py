"""python -m bench.fuzz --generated: every generated substitution the search uses in random
training steps until each has been applied in `cases_per_rule` cases (bench.fuzz.generated).

Rounds: the rules short of their cases are shuffled and dealt into cases of `units` units
(each case one capture: a random dtype, optimizer and sizes per unit); a rule counts a case
when one of its sites was applied in it (its own unit's or any other). A rule stops being
drawn when it has its cases, or when none of its first `tries` units got its own site (it
is then reported with the reasons). The table: per rule the cases it was applied in, how
many kept eager's numbers, how many did not, and its largest difference as a fraction of
what is allowed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.fuzz.generated import GenOutcome, run_generated_case, search_rule
from bench.fuzz.generated_model import UnitSpec, draw_unit


@dataclass
class Tally:
    """One rule over the fuzz: cases it was applied in, and how they ended."""

    name: str
    text: str
    drawn: int = 0                  # units of it drawn
    own: int = 0                    # of which its own site was applied
    cases: int = 0                  # cases where any site of it was applied
    runs: int = 0                   # eager comparisons of those cases
    ok: int = 0
    bad: int = 0
    worst: float = 0.0
    missed: Counter = field(default_factory=Counter)   # why its own site was not applied
    dtypes: Counter = field(default_factory=Counter)   # cases by dtype


@dataclass
class FuzzResult:
    tallies: dict[int, Tally]
    outcomes: list[GenOutcome]
    seconds: float

    def short(self, n: int) -> list[Tally]:
        return [t for t in self.tallies.values() if t.cases < n]

    def not_ok(self) -> list[GenOutcome]:
        return [o for o in self.outcomes if o.status != "ok"]


def fuzz_generated(rules: Sequence[int] | None = None, cases_per_rule: int = 100, seed: int = 0,
                   units: int = 48, runs: int = 1, tries: int = 3, jobs: int = 1,
                   report: Callable[[GenOutcome], None] | None = None) -> FuzzResult:
    """Cases until every rule of `rules` (indices into the search's GeneratedRule().rules();
    None: all) has `cases_per_rule` cases or is found not to apply (module doc). jobs > 1:
    each round's cases run in that many worker processes (the same cases and outcomes)."""
    if min(cases_per_rule, units, runs, tries, jobs) < 1:
        raise ValueError("fuzz_generated: cases_per_rule, units, runs, tries and jobs must be at least 1")
    all_rules = search_rule().rules()
    picked = list(range(len(all_rules))) if rules is None else list(rules)
    bad = [i for i in picked if not 0 <= i < len(all_rules)]
    if bad:
        raise ValueError(f"fuzz_generated: rules {bad[:5]} are not indices of the {len(all_rules)} rules")
    tallies = {i: Tally(all_rules[i].name, all_rules[i].describe()) for i in picked}
    rng = random.Random(seed)
    outcomes: list[GenOutcome] = []
    t0 = time.perf_counter()
    while True:
        pending = [i for i, t in tallies.items()
                   if t.cases < cases_per_rule and not (t.drawn >= tries and t.own == 0)
                   and t.drawn < 3 * cases_per_rule]
        if not pending:
            break
        rng.shuffle(pending)
        cases = [([draw_unit(rng, i, all_rules[i]) for i in pending[at:at + units]],
                  seed * 100_003 + len(outcomes) + n, runs)
                 for n, at in enumerate(range(0, len(pending), units))]
        for out in _run_all(cases, jobs):
            outcomes.append(out)
            _count(tallies, out)
            if report is not None:
                report(out)
    return FuzzResult(tallies, outcomes, time.perf_counter() - t0)


def _one(case: tuple[list[UnitSpec], int, int]) -> GenOutcome:
    torch.set_num_threads(1)
    return run_generated_case(*case)


def _run_all(cases: list[tuple[list[UnitSpec], int, int]], jobs: int) -> Iterator[GenOutcome]:
    if jobs == 1:
        yield from (run_generated_case(*c) for c in cases)
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        yield from pool.map(_one, cases)


def _count(tallies: dict[int, Tally], out: GenOutcome) -> None:
    for j, spec in enumerate(out.specs):
        t = tallies[spec.index]
        t.drawn += 1
        t.own += j in out.own
        if j in out.missed:
            t.missed[out.missed[j]] += 1
    for index in out.applied if out.status != "crash" else {s.index for s in out.specs}:
        if index not in tallies:       # a rule outside the selection applied at some other site
            continue
        t = tallies[index]
        t.cases += 1
        t.runs += out.runs
        t.dtypes[out.dtype] += 1
        if out.rule_ok(index):
            t.ok += 1
        else:
            t.bad += 1
        t.worst = max(t.worst, out.rule_worst(index))


def rule_table(result: FuzzResult) -> Table:
    table = Table(title=f"bench.fuzz --generated: {len(result.outcomes)} cases")
    for col in ("rule", "cases", "ok", "not ok", "worst / allowed", "float64", "float32", "bf16 autocast"):
        if col == "rule":
            table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=64)
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for t in result.tallies.values():
        table.add_row(escape(t.text), str(t.cases), str(t.ok), str(t.bad), f"{t.worst:.3f}",
                      *(str(t.dtypes[d]) for d in ("float64", "float32", "bf16 autocast")))
    return table


def summary(console: Console, result: FuzzResult, cases_per_rule: int) -> int:
    """The rules short of their cases with the reasons, the cases not ok; 1 if any."""
    short = result.short(cases_per_rule)
    if short:
        console.print(f"{len(short)} rules with fewer than {cases_per_rule} cases:")
        reasons = Counter(r for t in short for r in t.missed)
        for t in short:
            why = "; ".join(f"{r} ({n}x)" for r, n in t.missed.most_common(2)) or "applied elsewhere only"
            console.print(escape(f"  {t.text}: {t.cases} cases, own site {t.own} of {t.drawn} units: {why}"))
        console.print(escape(f"  reasons over them: {dict(reasons.most_common(6))}"))
    bad = result.not_ok()
    for o in bad:
        console.print(f"[red]case seed {o.seed} {o.status}[/red] ({o.dtype}): " + escape(o.detail[:2000]))
    tallies = list(result.tallies.values())
    full = sum(t.cases >= cases_per_rule for t in tallies)
    worst = max((t.worst for t in tallies), default=0.0)
    units = sum(len(o.specs) for o in result.outcomes)
    console.print(f"{len(tallies)} rules, {full} with at least {cases_per_rule} cases; {len(result.outcomes)} cases "
                  f"({units} units, {Counter(o.dtype for o in result.outcomes)}) in {result.seconds:.0f} s; "
                  f"{len(bad)} cases not ok; worst difference {worst:.3f} of allowed")
    return 1 if bad or short else 0


def main(argv: list[str] | None = None) -> int:
    """python -m bench.fuzz --generated [--cases-per-rule N] [--seed S] [--units U] [--runs R]
    [--jobs J] [--rules r0017,...] [--sample K]: the table and the summary; 1 when a case is
    not ok or a rule is short of its cases."""
    p = argparse.ArgumentParser(prog="python -m bench.fuzz --generated", description=__doc__)
    p.add_argument("--cases-per-rule", type=int, default=100, help="cases each rule is applied in")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--units", type=int, default=48, help="rules' source graphs per case")
    p.add_argument("--runs", type=int, default=1, help="eager comparisons per case (fresh values each)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--rules", default=None, help="only these rules (comma-separated names, e.g. r0017)")
    p.add_argument("--sample", type=int, default=None, help="a random sample of this many rules")
    args = p.parse_args(argv)
    console = Console(width=max(150, Console().width))
    all_rules = search_rule().rules()
    index = {r.name: i for i, r in enumerate(all_rules)}
    picked: list[int] | None = None
    if args.rules:
        names = args.rules.split(",")
        unknown = [n for n in names if n not in index]
        if unknown:
            p.error(f"--rules: {unknown} are not rules the search uses (GeneratedRule().rules())")
        picked = [index[n] for n in names]
    if args.sample:
        picked = sorted(random.Random(args.seed).sample(picked or list(range(len(all_rules))), args.sample))

    def progress(o: GenOutcome) -> None:
        if o.status != "ok":
            console.print(f"[red]seed {o.seed} {o.status}[/red]: " + escape(o.detail[:400]))

    result = fuzz_generated(picked, args.cases_per_rule, args.seed, args.units, args.runs, jobs=args.jobs,
                            report=progress)
    console.print(rule_table(result))
    return summary(console, result, args.cases_per_rule)
