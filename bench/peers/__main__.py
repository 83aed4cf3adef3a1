"""python -m bench.peers: run the peers on the workloads and write tables and plots.

    python -m bench.peers                      # tiny + paper, all workloads, default sweep
    python -m bench.peers --quick              # smoke run: bert-base, aot_eager, 3 budgets, dp
    python -m bench.peers --sizes tiny --workloads bert-base,unet --tools eager,compile
    python -m bench.peers --sizes medium       # measured on this CPU at batch 8: eager, checkpointing,
                                               # selective checkpointing, gradient accumulation
    python -m bench.peers --headline [...]     # the opening table (bench.peers.headline; --headline --help)

Default sweep: aot_eager x budgets 1.0, 0.8, 0.6, 0.4, 0.2, 0.0 x solvers dp/greedy/ilp;
inductor x budgets 1.0, 0.4, 0.0 with dp only (each Inductor compile of a tiny model takes
~45 s on 2 cores; --inductor-budgets/--inductor-solvers widen it). Budgets 1.0 and 0.0 run
no knapsack, so they appear once (dp). Tiny runs use 1 torch thread by default (--threads):
the 2 cores are shared, and oversubscribed OpenMP regions made times swing 10x.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.peers import headline, measure, plots, report, results, simulate
from bench.peers.tools import BUDGETS, FAMILIES, SOLVERS, Tool, all_tools, compile_tools
from peakcut.runtime import keep_freed_host_memory
from peakcut.workloads import WORKLOAD_NAMES, get_workload

HERE = Path(__file__).parent
MEDIUM_TOOLS = "eager,checkpoint,sac,accumulate"    # default families at medium size
MEDIUM_BATCH = 8      # every workload's medium model at this batch, so that k = 2, 4, 8 divide it


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,paper", help="tiny (measured) and/or paper (simulated)")
    p.add_argument("--workloads", default=None, help=f"comma list of {', '.join(WORKLOAD_NAMES)}")
    p.add_argument("--tools", default=None, help=f"families: {', '.join(FAMILIES)} (default: all; "
                   f"medium only: {MEDIUM_TOOLS})")
    p.add_argument("--medium-batch", type=int, default=MEDIUM_BATCH, help="batch of the medium models")
    p.add_argument("--backends", default="aot_eager,inductor")
    p.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS))
    p.add_argument("--solvers", default=",".join(SOLVERS), help="aot_eager solvers")
    p.add_argument("--inductor-budgets", default="1.0,0.4,0.0")
    p.add_argument("--inductor-solvers", default="dp")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the tiny sizes run: auto = cuda when a GPU is present, else cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the tiny runs (0 = torch default)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed steps per tool (tiny: default 7, >= 5; medium: default 3)")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the markdown and plots from bench/peers/results-<size>.json")
    p.add_argument("--merge", action="store_true",
                   help="update the cells of this run in bench/peers/results-<size>.json instead of replacing it")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: bert-base, aot_eager, budgets 1.0/0.4/0.0, dp, 5 repeats")
    p.add_argument("--out", default=None, help="markdown output ('' = stdout only; default bench/peers.md, "
                   "with --quick stdout only)")
    p.add_argument("--plots", default=None, help="folder for the Pareto PNGs ('' = none; default "
                   "bench/peers/plots, with --quick none)")
    args = p.parse_args(argv)
    if args.quick:
        args.workloads = args.workloads or "bert-base"
        args.backends, args.budgets, args.solvers = "aot_eager", "1.0,0.4,0.0", "dp"
        args.repeats = 5
    if args.out is None:
        medium_only = _csv(args.sizes) == ["medium"]
        args.out = "" if args.quick else str(HERE.parent / ("peers_medium.md" if medium_only else "peers.md"))
    if args.plots is None:
        args.plots = "" if args.quick else str(plots.PLOT_DIR)
    args.workloads = args.workloads or ",".join(WORKLOAD_NAMES)
    if args.tools is None:
        args.tools = MEDIUM_TOOLS if _csv(args.sizes) == ["medium"] else ",".join(FAMILIES)
    return args


def tool_list(args: argparse.Namespace) -> list[Tool]:
    """Rows in table order."""
    families = tuple(_csv(args.tools))
    budgets = tuple(float(b) for b in _csv(args.budgets))
    backends = _csv(args.backends)
    tools = [t for t in all_tools(families, backends=()) if t.family != "compile"]
    if "compile" in families:
        compiled = []
        if "aot_eager" in backends:
            compiled += compile_tools(("aot_eager",), budgets, tuple(_csv(args.solvers)))
        if "inductor" in backends:
            compiled += compile_tools(("inductor",), tuple(float(b) for b in _csv(args.inductor_budgets)),
                                      tuple(_csv(args.inductor_solvers)))
        peakcut_rows = [t for t in tools if t.family == "peakcut"]
        tools = [t for t in tools if t.family != "peakcut"] + compiled + peakcut_rows
    return tools


def run_size(size: str, workloads: list[str], tools: list[Tool], repeats: int | None,
             device: str = "cpu", medium_batch: int = MEDIUM_BATCH) -> list[results.Cell]:
    cells: list[results.Cell] = []
    for name in workloads:
        inst = get_workload(name).build(size, batch_size=medium_batch if size == "medium" else None)
        t0 = time.perf_counter()
        if size == "tiny":
            mine = [measure.measure_tool(t, inst, repeats=repeats or 7, device=device) for t in tools]
        elif size == "medium":
            mine = [measure.measure_tool(t, inst, repeats=repeats or 3, peak_repeats=1, device=device)
                    for t in tools]
        else:
            mine = simulate.simulate_workload(inst, tools)
        cells += mine
        failed = sum(not c.ok for c in mine)
        print(f"[bench.peers] {size} {name}: {len(mine)} tools, {failed} failed, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return cells


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--headline" in argv:
        headline.main([a for a in argv if a != "--headline"])
        return
    args = parse_args(argv)
    if args.repeats is not None and args.repeats < 5 and not args.quick and "tiny" in _csv(args.sizes):
        raise SystemExit("--repeats must be >= 5 at tiny size")
    if "medium" in _csv(args.sizes):
        keep_freed_host_memory()      # as under peakcut.optimize and bench.measured
    workloads = _csv(args.workloads)
    for w in workloads:
        get_workload(w)  # validates the name
    tools = tool_list(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    sections = []
    for size in _csv(args.sizes):
        path = HERE / f"results-{size}{'-quick' if args.quick else ''}.json"
        if args.report_only:
            if not path.exists():
                continue
            cells, meta = results.load(path)
        else:
            t0 = time.perf_counter()
            device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
            cells = run_size(size, workloads, tools, args.repeats, device, args.medium_batch)
            how = (f"{size} measured on cuda: max_memory_allocated, CUDA events" if device == "cuda"
                   else f"{size} measured on cpu: allocator events + caller-held bytes, wall time")
            if size == "medium":
                how += f", batch {args.medium_batch}"
            meta = {"env": f"{report.environment()} {how if size != 'paper' else ''}".strip(),
                    "seconds": time.perf_counter() - t0,
                    "workloads": workloads, "tools": [t.name for t in tools]}
            if args.merge and path.exists():
                cells, meta = results.merge(*results.load(path), cells, meta)
            results.save(cells, path, meta)
        sections.append(report.markdown(cells, size, meta))
        if args.plots:
            for w in meta["workloads"]:
                plots.pareto_plot(cells, w, size, Path(args.plots))
    text = ("# Peers: eager, activation checkpointing (per block, selective), gradient accumulation, "
            "torch.compile memory budget, ZeRO-Offload, peakcut\n\n") + "\n".join(sections)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
