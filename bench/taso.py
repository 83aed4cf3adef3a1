"""Generated TASO substitutions: enumerate every graph of up to three vocabulary ops, group
them by fingerprint, prove each candidate, prune the redundant ones, and write the rule set.

    python -m bench.taso                    # regenerate src/peakcut/taso/rules.json and bench/taso.md
    python -m bench.taso --check            # regenerate in memory, fail if the committed file differs
    python -m bench.taso --limit 5000 --out /tmp/rules.json --md -   # a quick slice

Prints the count of every step (enumerated terms, fingerprint-equal candidates, after
renaming, proved, after pruning) with its seconds, the reasons candidates were not proved,
what each pruning step removed, and the same counts per op (a candidate counts for every op
in either graph). The file holds no timing, so regenerating gives the same bytes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from peakcut.taso.generate import STEPS, Generated, generate
from peakcut.taso.ops import OPS, op
from peakcut.taso.ruleset import dumps

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "src" / "peakcut" / "taso" / "rules.json"
MD = ROOT / "bench" / "taso.md"


def report(g: Generated, wall: float, command: str) -> str:
    lines = [
        f"Command: `{command}`. Run on this machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; wall time {wall:.1f} s "
        "(measured, one run; the counts do not depend on the machine).",
        "",
        "| step | count | s |",
        "|---|---|---|",
        *(f"| {s} | {g.counts[s]} | {g.seconds[s]} |" for s in STEPS),
        "",
        "Fingerprint-equal terms that make no candidate: "
        + (", ".join(f"{k} {v}" for k, v in sorted(g.unpaired.items())) or "none")
        + ". Not proved: " + (", ".join(f"{k} {v}" for k, v in sorted(g.rejected.items())) or "none")
        + ". Pruned: " + (", ".join(f"{k} {v}" for k, v in sorted(g.pruned.items())) or "none") + ".",
        "",
        "Per op (items holding the op in either graph):",
        "",
        "| op | ATen | " + " | ".join(STEPS) + " |",
        "|---|---|" + "---|" * len(STEPS),
    ]
    for o in OPS:
        lines.append(f"| {o.key} | {o.aten} | "
                     + " | ".join(str(g.per_op[s].get(o.key, 0)) for s in STEPS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.taso", description=__doc__.split("\n")[0])
    ap.add_argument("--max-ops", type=int, default=3, help="ops per graph (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fingerprint inputs")
    ap.add_argument("--limit", type=int, default=None, help="only the first LIMIT terms")
    ap.add_argument("--ops", default=None,
                    help="comma-separated op keys to enumerate with (default: the whole vocabulary)")
    ap.add_argument("--out", default=str(RULES), help="where the rule set goes")
    ap.add_argument("--md", default=str(MD), help="where the report goes ('-': nowhere)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when the regenerated set differs from --out")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    ops = OPS if args.ops is None else tuple(op(k) for k in args.ops.split(","))
    g = generate(max_ops=args.max_ops, seed=args.seed, limit=args.limit, ops=ops,
                 progress=lambda s: print(s, flush=True))
    wall = time.perf_counter() - start
    command = "python -m bench.taso" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    text = report(g, wall, command)
    print(text)
    data = dumps(g.rules)
    if args.check:
        same = Path(args.out).read_text() == data
        print(f"{args.out}: {'the same' if same else 'DIFFERS from the regenerated'} rule set")
        return 0 if same else 1
    Path(args.out).write_text(data)
    print(f"wrote {len(g.rules.rules)} rules to {args.out}")
    if args.md != "-":
        Path(args.md).write_text(HEADER + "\n" + text)
    return 0


HEADER = """# bench.taso: generated substitutions

`python -m bench.taso` enumerates every graph of up to three ops of peakcut's TASO vocabulary
(`peakcut.taso.ops`: mm, add, sub, mul, cat, neg, relu, gelu, t, slice, sum, softmax over 2-D
tensors) on four symbolic inputs (a, b of shape m x n; c, d of shape n x k), groups them by
fingerprint (exact integers modulo a prime), proves every candidate by symbolic execution at two
shapes (exact rational arithmetic, element-wise functions uninterpreted), prunes redundant ones
(renaming, implied by smaller substitutions, common sub-graph) and writes
`src/peakcut/taso/rules.json`. `docs/taso.md` describes each step.
"""


if __name__ == "__main__":
    raise SystemExit(main())
