"""python -m bench.fuzz --generated: every generated substitution the search uses in random
training steps until each has been applied in `cases_per_rule` cases (bench.fuzz.generated).

Rounds: the rules short of their cases are shuffled and dealt evenly into cases of at most
`units` units (each case one capture: a random dtype, optimizer and sizes per unit); a rule
counts a case when one of its sites was applied in it (its own unit's or any other). A rule
stops being drawn when it has its cases, or when none of its first `tries` units outside
autocast got its own site (it is then reported with the reasons); under bf16 autocast a
matmul's operands are cast first, so a source with a matmul has no site there, and such a
rule takes its cases from the float32 and float64 ones. The table: per rule the cases it was applied in, how
many kept eager's numbers, how many did not, and its largest difference as a fraction of
what is allowed.

A run is long (every rule in 100 cases is hours of CPU), so `--record FILE` keeps the
tallies in a JSON file after every case and `--resume` goes on from it: a resumed run deals its
rounds from the record's tallies, and its cases' seeds follow the record's last, so no case
is run twice. `--until SECONDS` stops after the case that passes that wall time, counting the
cases other workers are running then (the record then says how far it got).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    missed_autocast: int = 0        # of which in a case under bf16 autocast, its own site not applied
    cases: int = 0                  # cases where any site of it was applied
    runs: int = 0                   # eager comparisons of those cases
    ok: int = 0
    bad: int = 0
    worst: float = 0.0
    missed: Counter = field(default_factory=Counter)   # why its own site was not applied
    dtypes: Counter = field(default_factory=Counter)   # cases by dtype


RECORD_VERSION = 1


@dataclass
class Record:
    """What a recorded run has counted so far: the tallies by rule index, the cases run (the
    next case's number), the seconds spent, and the cases that were not ok (seed, status,
    dtype, the rules applied, the detail's start)."""

    seed: int
    units: int
    runs: int
    cases_per_rule: int
    tallies: dict[int, Tally]
    cases: int = 0
    seconds: float = 0.0
    not_ok: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"version": RECORD_VERSION, "seed": self.seed, "units": self.units, "runs": self.runs,
                "cases_per_rule": self.cases_per_rule, "cases": self.cases, "seconds": round(self.seconds, 1),
                "not_ok": self.not_ok,
                "tallies": {str(i): {**asdict(t), "missed": dict(t.missed), "dtypes": dict(t.dtypes)}
                            for i, t in self.tallies.items()}}

    @staticmethod
    def from_json(doc: dict[str, Any], where: str) -> Record:
        if doc.get("version") != RECORD_VERSION:
            raise ValueError(f"{where}: record version {doc.get('version')!r}, this code reads {RECORD_VERSION}")
        tallies = {int(i): Tally(**{**t, "missed": Counter(t["missed"]), "dtypes": Counter(t["dtypes"])})
                   for i, t in doc["tallies"].items()}
        return Record(doc["seed"], doc["units"], doc["runs"], doc["cases_per_rule"], tallies, doc["cases"],
                      doc["seconds"], list(doc["not_ok"]))

    def save(self, path: Path) -> None:
        """Written whole to a temporary file, then renamed: a killed run leaves the last record."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> Record:
        return Record.from_json(json.loads(path.read_text()), str(path))


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
                   report: Callable[[GenOutcome], None] | None = None, record: Record | None = None,
                   until: float | None = None) -> FuzzResult:
    """Cases until every rule of `rules` (indices into the search's GeneratedRule().rules();
    None: all) has `cases_per_rule` cases or is found not to apply (module doc). jobs > 1:
    each round's cases run in that many worker processes (the same cases and outcomes).
    `record`: tallies to go on from (its cases continue the seeds) and to count into; its
    tallies for the rules picked are the result's. `until`: stop drawing rounds and cases
    after this many seconds."""
    if min(cases_per_rule, units, runs, tries, jobs) < 1:
        raise ValueError("fuzz_generated: cases_per_rule, units, runs, tries and jobs must be at least 1")
    all_rules = search_rule().rules()
    picked = list(range(len(all_rules))) if rules is None else list(rules)
    bad = [i for i in picked if not 0 <= i < len(all_rules)]
    if bad:
        raise ValueError(f"fuzz_generated: rules {bad[:5]} are not indices of the {len(all_rules)} rules")
    if record is None:
        record = Record(seed, units, runs, cases_per_rule, {})
    for i in picked:
        record.tallies.setdefault(i, Tally(all_rules[i].name, all_rules[i].describe()))
        if record.tallies[i].name != all_rules[i].name:
            raise ValueError(f"fuzz_generated: the record's rule {i} is {record.tallies[i].name}, "
                             f"the search's is {all_rules[i].name} (another rule set)")
    tallies = {i: record.tallies[i] for i in picked}
    first = record.cases
    rng = random.Random(seed if first == 0 else f"{seed}/{first}")
    outcomes: list[GenOutcome] = []
    t0 = time.perf_counter()
    spent = record.seconds

    def take(out: GenOutcome) -> None:
        outcomes.append(out)
        _count(tallies, out)
        record.cases += 1
        record.seconds = spent + time.perf_counter() - t0
        if out.status != "ok":
            record.not_ok.append({"seed": out.seed, "status": out.status, "dtype": out.dtype,
                                  "rules": sorted(all_rules[i].name for i in out.applied),
                                  "detail": out.detail[:1000]})
        if report is not None:
            report(out)

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) if jobs > 1 else None
    try:
        while until is None or time.perf_counter() - t0 < until:
            pending = [i for i, t in tallies.items()
                       if t.cases < cases_per_rule and not (t.drawn - t.missed_autocast >= tries and t.own == 0)
                       and t.drawn < 3 * cases_per_rule]
            if not pending:
                break
            rng.shuffle(pending)
            count = -(-len(pending) // units)        # cases of at most `units`, dealt evenly
            cases = [([draw_unit(rng, i, all_rules[i])
                       for i in pending[n * len(pending) // count:(n + 1) * len(pending) // count]],
                      seed * 100_003 + first + len(outcomes) + n, runs)
                     for n in range(count)]
            futures = [pool.submit(_one, c) for c in cases] if pool is not None else []
            done = (f.result() for f in futures) if pool is not None else (run_generated_case(*c) for c in cases)
            for k, out in enumerate(done):
                take(out)
                if until is not None and time.perf_counter() - t0 >= until:
                    # the cases not handed to the pool are dropped; those handed to it end and are counted
                    for f in [f for f in futures[k + 1:] if not f.cancel()]:
                        take(f.result())
                    break
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return FuzzResult(tallies, outcomes, time.perf_counter() - t0)


def _one(case: tuple[list[UnitSpec], int, int]) -> GenOutcome:
    torch.set_num_threads(1)
    return run_generated_case(*case)


def _count(tallies: dict[int, Tally], out: GenOutcome) -> None:
    for j, spec in enumerate(out.specs):
        t = tallies[spec.index]
        t.drawn += 1
        t.own += j in out.own
        if j in out.missed:
            t.missed[out.missed[j]] += 1
            t.missed_autocast += out.dtype == "bf16 autocast"
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


def summary(console: Console, result: FuzzResult, cases_per_rule: int, record: Record | None = None) -> int:
    """The rules short of their cases with the reasons, the cases not ok; 1 if any. With a
    record, the counts are the record's (every run that went into it)."""
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
    if record is not None:
        console.print(f"the record: {record.cases} cases in {record.seconds:.0f} s, {len(record.not_ok)} not ok")
        return 1 if record.not_ok or short else 0
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
    p.add_argument("--record", type=Path, default=None,
                   help="keep the tallies in this JSON file after every case (module doc)")
    p.add_argument("--resume", action="store_true", help="go on from --record's tallies")
    p.add_argument("--until", type=float, default=None, help="stop after the case that passes this many seconds")
    args = p.parse_args(argv)
    if args.resume and (args.record is None or not args.record.exists()):
        p.error("--resume needs --record naming an existing record")
    if args.record is not None and args.record.exists() and not args.resume:
        p.error(f"--record {args.record} exists: --resume goes on from it (or remove it to start afresh)")
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

    record = Record(args.seed, args.units, args.runs, args.cases_per_rule, {})
    if args.resume:
        record = Record.load(args.record)
        given = (args.seed, args.units, args.runs, args.cases_per_rule)
        if given != (record.seed, record.units, record.runs, record.cases_per_rule):
            p.error(f"--resume: the record was made with seed, units, runs, cases per rule = "
                    f"{(record.seed, record.units, record.runs, record.cases_per_rule)}, not {given}")

    def progress(o: GenOutcome) -> None:
        if o.status != "ok":
            console.print(f"[red]seed {o.seed} {o.status}[/red]: " + escape(o.detail[:400]))
        if args.record is not None:
            record.save(args.record)

    result = fuzz_generated(picked, args.cases_per_rule, args.seed, args.units, args.runs, jobs=args.jobs,
                            report=progress, record=record, until=args.until)
    console.print(rule_table(result))
    return summary(console, result, args.cases_per_rule, record if args.record is not None else None)
