"""python -m bench.peers --headline: peakcut against the best of every peer family at <= 1.10 latency.

    python -m bench.peers --headline                                   # 7 workloads x {h100, h200}
    python -m bench.peers --headline --workloads bert-base --budget 5  # a quick check
    python -m bench.peers --headline --reuse-peers                     # searches again, peers from the JSON
    python -m bench.peers --headline --report-only                     # markdown from the JSON

Paper sizes, simulated on one timeline: every configuration's step is a peakcut Graph whose peak
is peakcut.memory.simulate's and whose latency is simulate_timeline's on the profile (as
bench.peers.simulate.evaluate does). Per workload the eager step and the peers' steps are
captured once (gradient accumulation k = 2, 4, 8; torchtitan's selective checkpointing;
per-block checkpointing; torch.compile's activation budget x solver on the aot_eager partition;
ZeRO-Offload, placed per profile) and evaluated on every profile, `--peer-jobs` workloads at a
time in worker processes (default 2: the figures are simulated, so sharing the cores changes only
the run time). Then peakcut's row: optimize_graph on the eager capture with latency_limit=1.10 on
that profile, one search at a time, nothing else running (`--jobs` runs that many searches at
once in worker processes, which then share the cores). Where that plan holds less than the best
peer but runs slower, a second search under the best peer's latency says whether peakcut also
beats it at equal latency (`--no-match`: not).
Writes bench/peers/headline.json (merged with the cells of earlier runs, by workload and
profile), bench/peers_headline.md (table, legend, every configuration) and
bench/peers_headline_snippet.md (the table for the top of BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch

import peakcut
from bench.peers import report
from bench.peers.headline_table import LIMIT, TITLES, Entry, detail, legend, markdown, rows
from bench.peers.results import Cell, fail_reason
from bench.peers.simulate import evaluate, simulate_workload
from bench.peers.tools import Tool, all_tools, compile_tools
from peakcut import Graph
from peakcut.optimizer import optimize_graph
from peakcut.workloads import WORKLOAD_NAMES, WorkloadInstance, get_workload

HERE = Path(__file__).parent
JSON = HERE / "headline.json"
OUT = HERE.parent / "peers_headline.md"
SNIPPET = HERE.parent / "peers_headline_snippet.md"
PROFILES: tuple[str, ...] = ("h100", "h200")
BUDGET = 60.0
COMPILE_BUDGETS: tuple[float, ...] = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
COMPILE_SOLVERS: tuple[str, ...] = ("dp", "greedy")    # ilp needs scipy, absent here


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers --headline", description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOAD_NAMES))
    p.add_argument("--profiles", default=",".join(PROFILES))
    p.add_argument("--budget", type=float, default=BUDGET, help="seconds per peakcut search (one per cell)")
    p.add_argument("--limit", type=float, default=LIMIT, help="latency limit, a ratio to eager")
    p.add_argument("--compile-budgets", default=",".join(str(b) for b in COMPILE_BUDGETS))
    p.add_argument("--compile-solvers", default=",".join(COMPILE_SOLVERS))
    p.add_argument("--jobs", type=int, default=1, help="searches run at once (default 1: each search alone)")
    p.add_argument("--peer-jobs", type=int, default=2, help="workloads whose peers are captured at once")
    p.add_argument("--reuse-peers", action="store_true",
                   help="take the peers' cells from the JSON where it has them; run the searches")
    p.add_argument("--no-search", action="store_true", help="peers only (peakcut's cells from the JSON, if any)")
    p.add_argument("--no-match", dest="match", action="store_false",
                   help="no second search at the best peer's latency where peakcut's plan is slower than it")
    p.add_argument("--report-only", action="store_true", help="rebuild the markdown from the JSON")
    p.add_argument("--json", default=str(JSON))
    p.add_argument("--out", default=str(OUT), help="markdown report ('' = print only)")
    p.add_argument("--snippet", default=str(SNIPPET), help="the table for BENCHMARKS.md ('' = none)")
    return p.parse_args(argv)


def peer_tools(budgets: tuple[float, ...] = COMPILE_BUDGETS,
               solvers: tuple[str, ...] = COMPILE_SOLVERS) -> list[Tool]:
    """Eager and every peer family's configurations, in table order."""
    tools = [t for t in all_tools(("eager", "accumulate", "sac", "checkpoint"), backends=())]
    return tools + compile_tools(("aot_eager",), budgets, solvers) + [Tool("offload")]


def config_of(tool: Tool) -> str:
    """The configuration within its family, as the table names it."""
    if tool.family == "accumulate":
        return f"k={tool.k}"
    if tool.family == "compile":
        return f"budget {tool.budget:.1f} {tool.solver}"
    return ""


def peer_entries(inst: WorkloadInstance, g: Graph, tools: list[Tool], profiles: tuple[str, ...]) -> list[Entry]:
    """Every tool's step on `inst` (captured once) evaluated on each profile."""
    entries = []
    for tool, cell in zip(tools, simulate_workload(inst, tools, profiles, g), strict=True):
        for profile in profiles:
            e = Entry(inst.name, profile, tool.family, config_of(tool), note=cell.note, error=cell.error)
            if cell.ok:
                e.peak_bytes, e.latency_s = cell.peak(profile), cell.latency[profile]
            entries.append(e)
    return entries


def _peer_job(name: str, profiles: tuple[str, ...], budgets: tuple[float, ...],
              solvers: tuple[str, ...], threads: int = 0) -> tuple[list[Entry], float]:
    """Every peer of one workload (in a worker process: `threads` torch threads); and the seconds."""
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    inst = get_workload(name).build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    return peer_entries(inst, g, peer_tools(budgets, solvers), profiles), time.perf_counter() - t0


def search_entry(name: str, g: Graph, profile: str, budget: float, limit: float,
                 config: str = "") -> Entry:
    """peakcut's plan of eager step `g` under `limit` on `profile`, evaluated like the peers."""
    e = Entry(name, profile, "peakcut", config or f"latency <= x{limit:.2f}")
    try:
        t0 = time.perf_counter()
        found = optimize_graph(g, time_budget=budget, device=profile, latency_limit=limit)
        seconds = time.perf_counter() - t0
        cell = evaluate(Cell(name, "peakcut", "peakcut", "paper"), found.best.program, found.best.order, (profile,))
        e.peak_bytes, e.latency_s = int(cell.peak_bytes or 0), cell.latency[profile]
        e.extra = {"states": float(found.result.states), "seconds": seconds, "budget": budget}
        e.note = f"{found.result.states} states in {seconds:.0f} s ({found.result.stopped})"
    except Exception as ex:  # noqa: BLE001 - a failed search is a table cell, not a crash
        e.error = fail_reason(ex)
    return e


def _search_job(name: str, profile: str, budget: float, limit: float, config: str = "") -> Entry:
    """One search in a worker process (it captures the step itself)."""
    inst = get_workload(name).build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    return search_entry(name, g, profile, budget, limit, config)


def matches(entries: list[Entry], limit: float) -> list[tuple[str, str, float, str]]:
    """(workload, profile, latency limit, configuration) of the searches at the best peer's
    latency that the cells need (Row.to_match: peakcut's plan holds less but runs slower)."""
    out = []
    for row in rows(entries, limit):
        peer = row.to_match()
        if peer is not None:
            title = TITLES[peer.entry.family]
            out.append((row.workload, row.profile, peer.latency,
                        f"latency <= x{peer.latency:.3f} ({title}'s)"))
    return out


def load(path: Path) -> tuple[list[Entry], dict]:
    if not path.exists():
        return [], {"runs": []}
    data = json.loads(path.read_text())
    return [Entry(**d) for d in data["entries"]], data["meta"]


def save(path: Path, entries: list[Entry], meta: dict) -> None:
    path.write_text(json.dumps({"meta": meta, "entries": [asdict(e) for e in entries]}, indent=1))


def merged(old: list[Entry], new: list[Entry]) -> list[Entry]:
    """`old` without the (workload, profile, family) groups `new` has, then `new`; workload order kept."""
    fresh = {(e.workload, e.profile, e.family) for e in new}
    out = [e for e in old if (e.workload, e.profile, e.family) not in fresh] + new
    order = {w: i for i, w in enumerate(WORKLOAD_NAMES)}
    return sorted(out, key=lambda e: (order.get(e.workload, len(order)), e.profile))


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def run(args: argparse.Namespace, old: list[Entry]) -> list[Entry]:
    """The peers' entries (or the JSON's, with --reuse-peers), then the searches' entries."""
    profiles = tuple(_csv(args.profiles))
    budgets, solvers = tuple(float(b) for b in _csv(args.compile_budgets)), tuple(_csv(args.compile_solvers))
    names = _csv(args.workloads)
    entries: list[Entry] = []
    todo = []
    for name in names:
        have = [e for e in old if e.workload == name and e.profile in profiles and e.family != "peakcut"]
        if args.reuse_peers and {e.profile for e in have} == set(profiles):
            entries += have
        else:
            todo.append(name)
    if args.peer_jobs > 1 and len(todo) > 1:
        with _pool(args.peer_jobs) as pool:
            futures = {n: pool.submit(_peer_job, n, profiles, budgets, solvers, 1) for n in todo}
            for name, future in futures.items():
                mine, seconds = future.result()
                entries += mine
                print(f"[headline] {name}: peers {seconds:.0f} s (in a worker)", flush=True)
    else:
        for name in todo:
            mine, seconds = _peer_job(name, profiles, budgets, solvers)
            entries += mine
            print(f"[headline] {name}: peers {seconds:.0f} s", flush=True)
    if args.no_search:
        return entries
    entries += _searches([(n, p, args.limit, "") for n in names for p in profiles], args)
    if args.match:
        entries += _searches(matches(entries, args.limit), args)
    return entries


def _searches(todo: list[tuple[str, str, float, str]], args: argparse.Namespace) -> list[Entry]:
    """peakcut's entries for (workload, profile, latency limit, configuration) each."""
    if args.jobs > 1:
        with _pool(args.jobs) as pool:
            futures = [pool.submit(_search_job, n, p, args.budget, lim, c) for n, p, lim, c in todo]
            return [f.result() for f in futures]
    out = []
    captured: tuple[str, Graph] | None = None     # one captured step held at a time
    for name, profile, limit, config in todo:
        if captured is None or captured[0] != name:
            captured = None
            inst = get_workload(name).build("paper")
            captured = (name, peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
        e = search_entry(name, captured[1], profile, args.budget, limit, config)
        print(f"[headline] {name} {profile} {e.config}: peakcut {e.note or e.error}", flush=True)
        out.append(e)
    return out


def write(entries: list[Entry], meta: dict, args: argparse.Namespace) -> str:
    """The report's markdown (printed, and written where asked) and the snippet."""
    table = markdown(rows(entries, args.limit), entries, args.limit)
    runs = "; ".join(f"`{r['command']}` ({r['minutes']:.1f} min)" for r in meta["runs"])
    source = (f"Simulated (peakcut.memory.simulate + simulate_timeline on the analytic profiles), paper sizes, "
              f"AdamW update in every step. Made by: {runs}. {meta.get('env', '')}")
    text = "\n\n".join([f"# peakcut against the peers users pick, at <= x{args.limit:.2f} latency",
                        source, legend(args.limit), table,
                        "## Every configuration", detail(entries)]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.snippet:
        Path(args.snippet).write_text("\n\n".join([legend(args.limit), table, source]) + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in _csv(args.workloads):
        get_workload(name)       # validates the name
    path = Path(args.json)
    old, meta = load(path)
    if not args.report_only:
        t0 = time.perf_counter()
        new = run(args, old)
        entries = merged(old, new)
        env = report.environment()
        command = env.split("`")[1] if "`" in env else "python -m bench.peers --headline"
        kept = [e for e in entries if not any(e is n for n in new)]
        runs = meta.get("runs", []) if kept else []     # a run that replaced every cell stands alone
        meta["runs"] = [*runs, {"command": command, "minutes": (time.perf_counter() - t0) / 60}]
        meta["env"] = env.split(". ", 1)[1] if ". " in env else env
        save(path, entries, meta)
    else:
        entries = old
    write(entries, meta, args)


if __name__ == "__main__":
    main()
