"""Where the generated substitutions (src/peakcut/taso/rules.json) have sites in the captured
workloads: the AdamW step of each workload, captured over FakeTensors at paper size, searched
with peakcut.taso.match for every rule's source graph. Nothing runs and nothing is rewritten:
a site says the rule could fire there, not that a plan would gain from it.

    python -m bench.taso_sites                         # the seven paper workloads and the two LLMs
    python -m bench.taso_sites resnet50 bert-base --size tiny --md -

Per workload: the ops, the nodes the matcher reads as vocabulary ops, the sites, the rules
with a site, and the rules with the most sites (a site of a rule whose inner results other
nodes also read is counted, and marked shared: replacing it keeps those nodes).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

import peakcut
from peakcut.taso import load
from peakcut.taso.match import classify, find_matches
from peakcut.workloads import WORKLOAD_NAMES, get_workload

ROOT = Path(__file__).resolve().parents[1]
MD = ROOT / "bench" / "taso_sites.md"
TOP = 6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.taso_sites", description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", default=list(WORKLOAD_NAMES))
    ap.add_argument("--size", default="paper", help="the workloads' size (default paper)")
    ap.add_argument("--md", default=str(MD), help="where the table goes ('-': nowhere)")
    args = ap.parse_args(argv)
    rules = load().rules
    by_name = {r.name: r for r in rules}
    start = time.perf_counter()
    command = " ".join(["python -m bench.taso_sites", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"Command: `{command}`. Captured over FakeTensors on {platform.machine()}, torch {torch.__version__}; "
             f"{len(rules)} rules; nothing runs.", "",
             "| workload | ops | read as vocabulary ops | sites (shared) | rules with a site | most sites |",
             "|---|---|---|---|---|---|"]
    for name in args.workloads:
        inst = get_workload(name).build(args.size)
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        read = sum(1 for n in g.order if classify(g, n) is not None)
        matches = find_matches(g, rules)
        per_rule = Counter(m.rule for m in matches)
        shared = sum(1 for m in matches if m.shared)
        top = "; ".join(f"`{by_name[r].describe().split(': ', 1)[1]}` {c}"
                        for r, c in per_rule.most_common(TOP))
        row = (f"| {inst.description} | {len(g.nodes)} | {read} | {len(matches)} ({shared}) | "
               f"{len(per_rule)} | {top or '-'} |")
        print(row, flush=True)
        lines.append(row)
    lines += ["", f"{time.perf_counter() - start:.0f} s in all (measured, capture included)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md != "-":
        Path(args.md).write_text("# bench.taso_sites: where generated substitutions have sites\n\n"
                                 + __doc__.split("\n\n")[0].replace("\n", " ") + "\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
