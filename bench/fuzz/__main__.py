"""python -m bench.fuzz: random training steps through every rule (see bench.fuzz)."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.fuzz.harness import Outcome, run_case
from bench.fuzz.models import make_case
from peakcut.rules import RULES, UNDO_MOVES


def rule_table(outcomes: list[Outcome]) -> Table:
    """Rule x outcome: cases where the rule was applied, by how the case ended; refusals."""
    kinds = ["re-order", *RULES.move_kinds, UNDO_MOVES]
    table = Table(title=f"bench.fuzz: {len(outcomes)} cases")
    for col in ("move kind", "cases applied", "ok", "mismatch", "memory", "crash", "times applied", "times refused"):
        table.add_column(col, justify="left" if col == "move kind" else "right")
    for kind in kinds:
        used = [o for o in outcomes if o.applied[kind]]
        status = Counter(o.status for o in used)
        table.add_row(kind, str(len(used)), str(status["ok"]), str(status["mismatch"]), str(status["memory"]),
                      str(status["crash"]),
                      str(sum(o.applied[kind] for o in outcomes)), str(sum(o.refused[kind] for o in outcomes)))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="first case's seed (cases are seed, seed+1, ...)")
    p.add_argument("--moves", type=int, default=3, help="random moves per case")
    args = p.parse_args(argv)
    console = Console()
    t0 = time.perf_counter()
    outcomes = []
    for seed in range(args.seed, args.seed + args.cases):
        out = run_case(make_case(seed), args.moves)
        outcomes.append(out)
        if out.status != "ok":
            console.print(f"[red]seed {seed} {out.status}[/red]: "
                          + escape(f"{out.description}; moves {out.steps}\n{out.detail}"))
    console.print(rule_table(outcomes))
    bad = [o for o in outcomes if o.status != "ok"]
    console.print(f"{len(outcomes)} cases in {time.perf_counter() - t0:.0f} s: {len(bad)} not ok "
                  f"({', '.join(str(o.seed) for o in bad) or 'none'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
