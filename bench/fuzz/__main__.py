"""python -m bench.fuzz: random training steps through every rule (see bench.fuzz)."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.fuzz.harness import Outcome, run_case
from bench.fuzz.models import draw_case, make_case
from peakcut.rules import REWRITE_MOVES, RULES, UNDO_MOVES


def rule_table(outcomes: list[Outcome]) -> Table:
    """Rule x outcome: cases where the rule was applied, by how the case ended; refusals."""
    kinds = ["re-order", *RULES.move_kinds, *(f"{REWRITE_MOVES}: {k}" for k in RULES.rewrite_kinds), UNDO_MOVES]
    table = Table(title=f"bench.fuzz: {len(outcomes)} cases")
    for col in ("move kind", "cases applied", "ok", "mismatch", "memory", "crash", "times applied", "times refused"):
        table.add_column(col, justify="left" if col == "move kind" else "right", no_wrap=col == "move kind")
    for kind in kinds:
        used = [o for o in outcomes if o.applied[kind]]
        status = Counter(o.status for o in used)
        table.add_row(kind, str(len(used)), str(status["ok"]), str(status["mismatch"]), str(status["memory"]),
                      str(status["crash"]),
                      str(sum(o.applied[kind] for o in outcomes)), str(sum(o.refused[kind] for o in outcomes)))
    return table


def case_table(outcomes: list[Outcome]) -> Table:
    """Case kind x outcome, and for the cases compared by bench.fuzz.loop (the user's loop,
    bf16 autocast) the largest difference seen as a share of what is allowed."""
    table = Table(title="cases by kind")
    for col in ("case kind", "cases", "ok", "mismatch", "memory", "crash", "worst / allowed"):
        table.add_column(col, justify="left" if col == "case kind" else "right", no_wrap=col == "case kind")
    for tag in sorted({t for o in outcomes for t in o.tags}):
        cases = [o for o in outcomes if tag in o.tags]
        status = Counter(o.status for o in cases)
        worst = [o.worst for o in cases if o.worst is not None]
        table.add_row(tag, str(len(cases)), str(status["ok"]), str(status["mismatch"]), str(status["memory"]),
                      str(status["crash"]), f"{max(worst):.3f}" if worst else "-")
    return table


def shrink(console: Console, examples: int, moves: int, seed: int) -> int:
    """Hypothesis draws cases (st.randoms(): every choice of draw_case and of the walk) until
    one is not ok, then shrinks it; print the smallest failing case it ran."""
    from hypothesis import find, settings  # a test dependency: only --shrink needs it
    from hypothesis import strategies as st
    from hypothesis.errors import Flaky, NoSuchExample

    failing: list[tuple[str, Outcome]] = []

    def not_ok(rng: random.Random) -> bool:
        case = draw_case(rng)
        out = run_case(case, rng.randint(0, moves))
        if out.status != "ok":
            failing.append((case.description, out))
        return out.status != "ok"

    try:
        find(st.randoms(use_true_random=False), not_ok,
             settings=settings(max_examples=examples, database=None, deadline=None),
             random=random.Random(seed))
    except NoSuchExample:
        console.print(f"{examples} cases drawn by hypothesis: all ok")
        return 0
    except Flaky as e:     # a failure that did not fail again when replayed (a timing-dependent walk)
        console.print(f"[red]a failing case did not fail again when replayed[/red]: {escape(str(e))}")
        if not failing:
            return 1
    description, out = failing[-1]
    console.print(f"[red]shrunk {out.status}[/red] ({len(failing)} failing cases seen): "
                  + escape(f"{description}; moves {out.steps}\n{out.detail}"))
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--generated" in argv:       # the generated substitutions: bench.fuzz.generated_main
        from bench.fuzz.generated_main import main as generated
        return generated([a for a in argv if a != "--generated"])
    p = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="first case's seed (cases are seed, seed+1, ...)")
    p.add_argument("--moves", type=int, default=5, help="random moves per case")
    p.add_argument("--shrink", type=int, metavar="N", default=0,
                   help="instead: let hypothesis draw up to N cases and shrink the first that is not ok")
    args = p.parse_args(argv)
    console = Console(width=max(100, Console().width))
    if args.shrink:
        return shrink(console, args.shrink, args.moves, args.seed)
    t0 = time.perf_counter()
    outcomes = []
    for seed in range(args.seed, args.seed + args.cases):
        out = run_case(make_case(seed), args.moves)
        outcomes.append(out)
        if out.status != "ok":
            console.print(f"[red]seed {seed} {out.status}[/red]: "
                          + escape(f"{out.description}; moves {out.steps}\n{out.detail}"))
    console.print(rule_table(outcomes))
    console.print(case_table(outcomes))
    bad = [o for o in outcomes if o.status != "ok"]
    console.print(f"{len(outcomes)} cases in {time.perf_counter() - t0:.0f} s: {len(bad)} not ok "
                  f"({', '.join(str(o.seed) for o in bad) or 'none'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
