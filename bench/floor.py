"""The floor under every plan: the captured step run untransformed as a generated program,
against the user's eager loop, at medium size, measured on this machine.

    python -m bench.floor                       # all seven workloads, 11 rounds each
    python -m bench.floor unet resnet50 --rounds 15
    python -m bench.floor --update foreach      # the user's AdamW with foreach=True

For each workload: capture the AdamW step (torch.optim.AdamW, lr 1e-4; `--update` picks the
implementation torch.optim runs, the same on both sides: "default" is torch.optim's own
choice on the device (the for-loop on a CPU), "foreach" foreach=True, "fused" fused=True,
which peakcut captures as the list ops they are: capture.list_update), build the program
from the captured graph as it is (peakcut.build: no rule applied), then run eager and the
program one after the other for `rounds` rounds, after one warm-up step of each (model,
optimizer state and RNG restored afterwards: optimizer.verify.Restore). Printed per workload:
the median over the rounds of program time / eager time in the same round (the paired
figure bench.measured's verification reports), its spread, the ratio of the two medians and
of the two minima (the least noisy figure for a floor: each run's best case). Issue 16 asks
for at most 3% here. glibc malloc keeps freed memory (peakcut.runtime.host_allocator), as
under peakcut.optimize and bench.measured: without it, the eager AdamW step of the medium
GPT-Neo took 4.8 s here instead of 1.7 s (freed memory handed back to the system and
faulted in again).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

import peakcut
from bench.measured.run import interleaved
from peakcut.optimizer.verify import EagerStep, Restore
from peakcut.runtime.host_allocator import keep_freed_host_memory
from peakcut.workloads import WORKLOAD_NAMES, get_workload

UPDATES = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""--update: the AdamW options of each mode."""


def floor_row(name: str, rounds: int, size: str = "medium", update: str = "default") -> str:
    """One table row: the program's time against eager's for workload `name`."""
    inst = get_workload(name).build(size)
    opt = torch.optim.AdamW(inst.model.parameters(), lr=1e-4, **UPDATES[update])
    step = peakcut.build(peakcut.capture(inst.model, inst.batch, inst.loss_fn, opt))
    eager = EagerStep(inst.model, inst.batch, inst.loss_fn, opt, None)
    with Restore(inst.model, opt):
        eager()
        inputs = step.bind(inst.model, inst.batch)
        device = step.device_of(inputs)
        step.run(inputs, device)
        eager_s, (program_s,) = interleaved(eager, [lambda: step.run(inputs, device)], rounds)
    ratios = [p / e for p, e in zip(program_s, eager_s, strict=True)]
    return (f"| {inst.description} | {statistics.median(eager_s):.3f} | {statistics.median(program_s):.3f} | "
            f"x{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"x{statistics.median(program_s) / statistics.median(eager_s):.3f} | "
            f"x{min(program_s) / min(eager_s):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=list(WORKLOAD_NAMES))
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    ap.add_argument("--update", choices=sorted(UPDATES), default="default",
                    help="AdamW's implementation: torch.optim's default, foreach=True or fused=True")
    args = ap.parse_args()
    kept = keep_freed_host_memory()     # as peakcut.optimize and bench.measured run
    t0 = time.perf_counter()
    rows = []
    for name in args.workloads:
        rows.append(floor_row(name, args.rounds, update=args.update))
        print(rows[-1], file=sys.stderr, flush=True)      # progress: each row as it is measured
    mode = "" if args.update == "default" else f" --update {args.update}"
    print(f"Command: `python -m bench.floor {' '.join(args.workloads)} --rounds {args.rounds}{mode}`. Measured on this "
          f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; glibc "
          f"malloc keeps freed memory: {kept}; "
          f"{time.perf_counter() - t0:.0f} s in all.\n")
    print("| workload | eager s (median) | program s (median) | program / eager per round: median (min-max) "
          "| ratio of medians | ratio of minima |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
