"""What the generated substitutions and fused attention gain per workload: the AdamW step of
the seven paper workloads and the two LLMs at paper size (captured over FakeTensors; nothing
runs), searched on the H100 analytic profile with a fixed effort (max_states, one process, a
time budget far above what the states need) under two objectives, least memory at latency
<= 1.10 x eager and least latency at memory <= 40% of eager's peak, with these rule sets:

- hand: RULES without the generated substitutions (every hand rule);
- default: RULES (hand + generated);
- attention: default + fused attention alone, on GPT-Neo-1.3B and BTLM-3B-8K (the workloads
  with written-out attention);
- fused: WITH_FUSED (default + fused attention and the other fused substitutions it lists), on
  the same two, where WITH_FUSED adds something to attention.

    python -m bench.taso_gains                                  # every workload, 40 states
    python -m bench.taso_gains --workloads bert-base --max-states 20 --md - --json -
    python -m bench.taso_gains --render a.json b.json           # runs' records merged, no search

Before its searches, each workload's captured step gets every generated substitution that
applies, in capture order (no search): the substitutions and the simulated peak and latency
before and after.

Per cell: the plan's simulated peak (GiB, % of eager), latency (x eager), whether the limit
was met (else the floor the plan stands against), the states built, and the rewrites of the
plan's program by rule (the generated ones by substitution). All figures are simulated
(peakcut's timeline, H100 analytic profile); only the seconds a search took are measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.ir.graph import Graph
from peakcut.optimizer import optimize_graph
from peakcut.rules import RULES, WITH_FUSED, Registry
from peakcut.rules.generated_rule import GeneratedRule
from peakcut.rules.query import Query
from peakcut.simulate import simulate_timeline
from peakcut.workloads import ALL_WORKLOAD_NAMES, get_workload

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "bench" / "taso_gains.json"
MD = ROOT / "bench" / "taso_gains.md"
GIB = 2 ** 30
DEVICE = "h100"
OBJECTIVES = (("latency", 1.10), ("memory", 0.40))
FUSED_WORKLOADS = ("gpt-neo-1.3b", "btlm-3b")
GENERATED = "generated"
RULE_SETS = ("hand", "default", "attention", "fused")
ATTENTION = "fused_attention"


def without(registry: Registry, kind: str) -> Registry:
    """`registry` less its rule of `kind` (ValueError when it has none)."""
    kinds = [r.kind for r in (*registry.regions, *registry.programs, *registry.rewrites)]
    if kind not in kinds:
        raise ValueError(f"kind={kind!r}: the registry has no such rule; known: {kinds}")
    return Registry(regions=tuple(r for r in registry.regions if r.kind != kind),
                    programs=tuple(r for r in registry.programs if r.kind != kind),
                    rewrites=tuple(r for r in registry.rewrites if r.kind != kind))


def rule_sets(name: str, labels: tuple[str, ...] = RULE_SETS) -> dict[str, Registry]:
    """The rule sets of `labels` searched on workload `name` (module doc)."""
    sets = {"hand": without(RULES, GENERATED), "default": RULES}
    if name in FUSED_WORKLOADS:
        kept = {*RULES.rewrite_kinds, ATTENTION}
        sets["attention"] = Registry(regions=WITH_FUSED.regions, programs=WITH_FUSED.programs,
                                     rewrites=tuple(r for r in WITH_FUSED.rewrites if r.kind in kept))
        if set(WITH_FUSED.rewrite_kinds) != kept:
            sets["fused"] = WITH_FUSED
    return {k: v for k, v in sets.items() if k in labels}


def rewrites_by_rule(rewrites: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """The plan's rewrites counted by rule (the words before the first ':'), and the generated
    ones by substitution ('r0017: t(t(a)) => a')."""
    kinds: Counter[str] = Counter()
    generated: Counter[str] = Counter()
    for what in rewrites:
        head, _, rest = what.partition(": ")
        kinds[head] += 1
        if head == GENERATED:
            generated[rest] += 1
    return dict(sorted(kinds.items())), dict(sorted(generated.items()))


def direct(g: Graph) -> dict[str, Any]:
    """Every generated substitution that applies to the captured step, in capture order, no
    search: how many of each, and the step's simulated peak and latency before and after."""
    cost, rule = get_cost_model(DEVICE), GeneratedRule()
    order = list(g.order)
    before = simulate_timeline(g, order, cost)
    done: Counter[str] = Counter()
    for site in list(rule.sites(Query(g, order))):     # found once; a site an earlier one changed is skipped
        if rule.why_not(g, order, site) is None:
            rewrite = rule.apply(g, order, site)
            g, order = rewrite.graph, list(rewrite.order)
            done[site.description] += 1
    after = simulate_timeline(g, order, cost)
    return {"applied": dict(done.most_common()), "peak_bytes": [before.peak_bytes, after.peak_bytes],
            "latency_s": [before.latency_seconds, after.latency_seconds]}


def cell(g: Graph, mode: str, value: float, rules: Registry, max_states: int) -> dict[str, Any]:
    """One fixed-effort search of `g` under one objective with `rules`: its record."""
    kw = {"latency_limit": value} if mode == "latency" else {"memory_limit": value}
    t0 = time.perf_counter()
    r = optimize_graph(g, time_budget=1e6, max_states=max_states, device=DEVICE, rules=rules, **kw).report
    kinds, generated = rewrites_by_rule(r["rewrites"])
    floors = r["floors"] or {}
    return {"mode": mode, "limit_value": value, "limit": r["limit"], "feasible": r["feasible"],
            "peak_bytes": r["peak_bytes"], "peak_ratio": r["peak_ratio"], "latency_s": r["latency_s"],
            "latency_ratio": r["latency_ratio"], "eager_peak_bytes": r["eager_peak_bytes"],
            "eager_latency_s": r["eager_latency_s"], "states": r["search"]["states"],
            "stopped": r["search"]["stopped"], "rewrites": kinds, "generated": generated,
            "memory_floor_bytes": floors.get("memory_bytes"), "compute_floor_s": floors.get("compute_seconds"),
            "seconds": round(time.perf_counter() - t0, 1)}


def run(names: list[str], max_states: int, size: str = "paper", labels: tuple[str, ...] = RULE_SETS,
        objectives: tuple[tuple[str, float], ...] = OBJECTIVES, log: Any = sys.stderr, directly: bool = True,
        save: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Every workload in `names` at `size`: the generated substitutions applied directly (unless
    not `directly`), and the cells of rule sets `labels` and `objectives` (module doc); a record
    per workload. save(rows so far) runs after each step, so a long run keeps what it found."""
    torch.set_num_threads(1)
    out: list[dict[str, Any]] = []
    for name in names:
        t0 = time.perf_counter()
        inst = get_workload(name).build(size)
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        row: dict[str, Any] = {"workload": name, "description": inst.description, "nodes": len(g.nodes),
                               "capture_s": round(time.perf_counter() - t0, 1), "cells": {}}
        if directly:
            t1 = time.perf_counter()
            row["direct"] = direct(g)
            row["direct_s"] = round(time.perf_counter() - t1, 1)
            print(f"# {name} direct: {row['direct']}", file=log, flush=True)
            if save is not None:
                save([*out, row])
        for mode, value in objectives:             # objective by objective: a cut-short run keeps whole pairs
            for label, rules in rule_sets(name, labels).items():
                c = cell(g, mode, value, rules, max_states)
                row["cells"][f"{label}/{mode}"] = c
                print(f"# {name} {label} {mode}<={value}: peak {c['peak_ratio']:.1%}, x{c['latency_ratio']:.3f}, "
                      f"{'met' if c['feasible'] else 'NOT met'}, {c['states']} states, {c['seconds']} s, "
                      f"rewrites {c['rewrites']}", file=log, flush=True)
                if save is not None:
                    save([*out, row])
        out.append(row)
    return out


def _figure(c: dict[str, Any]) -> str:
    """A cell's plan: peak (GiB, % of eager), latency (x eager), and the floor where unmet."""
    text = f"{c['peak_bytes'] / GIB:.1f} GiB ({c['peak_ratio']:.1%}), x{c['latency_ratio']:.3f}"
    if c["feasible"]:
        return text
    if c["mode"] == "memory":
        floor = c["memory_floor_bytes"]
        return text + (f", **not met** (limit {c['limit'] / GIB:.1f} GiB; memory floor {floor / GIB:.1f} GiB)"
                       if floor is not None else ", **not met**")
    floor = c["compute_floor_s"]
    return text + (f", **not met** (compute floor x{floor / c['eager_latency_s']:.3f})"
                   if floor is not None else ", **not met**")


def _fired(c: dict[str, Any]) -> str:
    """The plan's rewrites by rule, the generated ones by substitution."""
    kinds = {k: v for k, v in c["rewrites"].items() if k != GENERATED}
    parts = [f"{k} {v}" for k, v in kinds.items()]
    parts += [f"`{rule}` {n}" for rule, n in c["generated"].items()]
    return "; ".join(parts) or "-"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: a line per workload, objective and rule set."""
    lines = ["| workload | objective | rules | plan: peak (% of eager), latency (x eager) | states | "
             "rewrites in the plan (generated: by substitution) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        for key, c in row["cells"].items():
            label = key.split("/")[0]
            objective = "latency <= 1.10" if c["mode"] == "latency" else "memory <= 40%"
            lines.append(f"| {row['description']} | {objective} | {label} | {_figure(c)} | {c['states']} | "
                         f"{_fired(c)} |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """A compact table: per workload and objective, the rule sets searched side by side (least
    memory as % of eager's peak at <= 1.10; least latency as x eager at 40%); "-": not searched."""
    used = [label for label in RULE_SETS if any(key.split("/")[0] == label for row in rows for key in row["cells"])]
    shown = {"hand": "hand", "default": "+generated", "attention": "+attention", "fused": "+fused"}
    names = " / ".join(shown[label] for label in used)
    lines = [f"| workload | least memory at <= 1.10 ({names}) | least latency at memory <= 40% ({names}) |",
             "|---|---|---|"]

    def short(c: dict[str, Any] | None, mode: str) -> str:
        if c is None:
            return "-"
        figure = f"{c['peak_ratio']:.1%}" if mode == "latency" else f"x{c['latency_ratio']:.3f}"
        return figure + ("" if c["feasible"] else " (not met)")

    for row in rows:
        parts = [" / ".join(short(row["cells"].get(f"{label}/{mode}"), mode) for label in used)
                 for mode, _ in OBJECTIVES]
        lines.append(f"| {row['workload']} | {parts[0]} | {parts[1]} |")
    return "\n".join(lines)


def direct_table(rows: list[dict[str, Any]]) -> str:
    """The generated substitutions applied to each captured step, no search (direct)."""
    lines = ["| workload | substitutions applied (by substitution) | simulated peak before -> after | "
             "simulated latency before -> after |", "|---|---|---|---|"]
    for row in rows:
        d = row.get("direct")
        if d is None:
            continue
        applied = "; ".join(f"`{rule}` {n}" for rule, n in d["applied"].items()) or "none"
        (p0, p1), (t0, t1) = d["peak_bytes"], d["latency_s"]
        lines.append(f"| {row['description']} | {sum(d['applied'].values())}: {applied} | "
                     f"{p0 / GIB:.2f} -> {p1 / GIB:.2f} GiB ({p1 - p0:+,} B) | "
                     f"{t0 * 1e3:.3f} -> {t1 * 1e3:.3f} ms ({(t1 - t0) * 1e6:+.1f} us) |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _moved(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two cells' plans differ in peak (bytes) or latency (beyond float rounding)."""
    return a["peak_bytes"] != b["peak_bytes"] or abs(a["latency_s"] - b["latency_s"]) > 1e-9 * a["latency_s"]


def findings(rows: list[dict[str, Any]]) -> str:
    """What the tables say, counted: the cells the generated substitutions move, the
    substitutions in the plans, and fused attention's effect at <= 1.10."""
    pairs = [(row, mode) for row in rows for mode, _ in OBJECTIVES
             if f"hand/{mode}" in row["cells"] and f"default/{mode}" in row["cells"]]
    moved = [(row["workload"], mode) for row, mode in pairs
             if _moved(row["cells"][f"hand/{mode}"], row["cells"][f"default/{mode}"])]
    fired: Counter[str] = Counter()
    plans = 0
    for row in rows:
        for key, c in row["cells"].items():
            if not key.startswith("hand/") and c["generated"]:
                plans += 1
                fired.update(c["generated"])
    lines = [f"- The generated substitutions move the plan (peak or latency) in {len(moved)} of {len(pairs)} "
             "cells against the hand rules alone" + (": " + ", ".join(f"{w} ({m})" for w, m in moved) if moved
                                                      else "") + ".",
             f"- Generated substitutions in the final plans ({plans} plans): "
             + ("; ".join(f"`{rule}` {n}x" for rule, n in fired.most_common()) if fired else "none") + "."]
    for row in rows:
        default = row["cells"].get("default/latency")
        steps = [(label, row["cells"][f"{label}/latency"]) for label in ("attention", "fused")
                 if f"{label}/latency" in row["cells"]]
        if default is not None and steps:
            lines.append(f"- At <= 1.10, {row['description']}: least memory {default['peak_ratio']:.1%} "
                         f"(x{default['latency_ratio']:.3f}) of eager's peak with the default rules, "
                         + ", ".join(f"{c['peak_ratio']:.1%} (x{c['latency_ratio']:.3f}) with {label}"
                                     for label, c in steps) + ".")
    return "\n".join(lines)


NOTE = ("A transpose (`aten.t`) is a view in peakcut's IR (peakcut.ir.registry): it holds no bytes, moves "
        "no data and costs the profile's view_seconds only (peakcut.cost.analytic), so a substitution that only "
        "removes or moves transposes (`t(t(a)) => a`, `t(mm(t(b), a)) => mm(t(a), b)`) leaves the simulated "
        "peak where it is and the latency within a view's issue time of where it is.")
CANCEL = " The hand rule cancel_transposes already removes pairs of transposes."


def _unwrapped(paragraph: str) -> str:
    """A docstring paragraph as markdown: each list item (or the prose) on one line."""
    items = paragraph.replace("\n- ", "\n\0- ").split("\n\0")
    return "\n".join(" ".join(item.split()) for item in items)


def merged(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records of several runs as one: the first's settings, every command, the rows merged by
    workload (cells, direct figures and rule sets: the last run's that has them)."""
    if not records:
        raise ValueError("records: expected at least one record to render")
    out = {**records[0], "command": "`; `".join(r["command"] for r in records), "rows": []}
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        for row in record["rows"]:
            into = rows.setdefault(row["workload"], {**row, "cells": {}})
            into["cells"].update(row["cells"])
            for key in ("direct", "direct_s"):
                if key in row:
                    into[key] = row[key]
        out["rule_sets"] = {**out.get("rule_sets", {}), **record.get("rule_sets", {})}
    out["rows"] = list(rows.values())
    return out


def render(record: dict[str, Any]) -> str:
    """The markdown page of a run's record (what main writes to --json)."""
    rows = record["rows"]
    seconds = sum(row["capture_s"] + row.get("direct_s", 0.0) + sum(c["seconds"] for c in row["cells"].values())
                  for row in rows)
    head = (f"Command: `{record['command']}`. Simulated, analytic H100 profile (peakcut's timeline): the AdamW "
            f"step captured over FakeTensors on {record.get('machine', 'x86_64')}, torch "
            f"{record.get('torch', torch.__version__)}; each search {record['max_states']} states, one process, "
            f"no clock cut-off; {seconds:.0f} s of wall time summed over the runs (measured on a shared 2-core "
            f"machine, capture included).")
    sets = "; ".join(f"{k}: {', '.join(v)}" for k, v in record.get("rule_sets", {}).items())
    direct = direct_table(rows)
    return ("# bench.taso_gains: what generated substitutions and fused attention gain\n\n"
            + "\n\n".join(_unwrapped(part) for part in __doc__.split("\n\n")[:2]) + "\n\n" + head + "\n\n"
            + summary(rows) + "\n\n" + findings(rows) + "\n\n" + NOTE
            + (CANCEL if "cancel_transposes" in record.get("rule_sets", {}).get("hand", ()) else "") + "\n\n"
            + (f"Every generated substitution that applies, applied to the captured step in capture order "
               f"(no search, H100 profile):\n\n{direct}\n\n" if direct else "")
            + "Every search:\n\n" + table(rows) + "\n\n"
            + (f"Rewrite rules of each rule set, in the order the search tries them: {sets}.\n" if sets else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.taso_gains", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(ALL_WORKLOAD_NAMES))
    ap.add_argument("--max-states", type=int, default=40, help="states each search builds (default 40)")
    ap.add_argument("--size", default="paper", help="the workloads' size (default paper)")
    ap.add_argument("--rules", nargs="+", default=list(RULE_SETS), choices=RULE_SETS,
                    help="the rule sets searched (default all; fused on GPT-Neo and BTLM only)")
    ap.add_argument("--objectives", nargs="+", default=[m for m, _ in OBJECTIVES], choices=[m for m, _ in OBJECTIVES],
                    help="latency: least memory at <= 1.10 x eager; memory: least latency at <= 40%%")
    ap.add_argument("--json", default=str(JSON), help="where every figure goes ('-': nowhere)")
    ap.add_argument("--md", default=str(MD), help="where the tables go ('-': nowhere)")
    ap.add_argument("--no-direct", action="store_true",
                    help="no direct application of the generated substitutions, searches only")
    ap.add_argument("--direct-only", action="store_true",
                    help="no search: only the generated substitutions applied to the captured step")
    ap.add_argument("--render", type=Path, nargs="+",
                    help="no capture: these records (--json files) merged by workload, written to --json and --md")
    args = ap.parse_args(argv)
    if args.max_states < 1:
        raise SystemExit(f"--max-states={args.max_states}: expected a number of states >= 1")
    if args.render is not None:
        record = merged([json.loads(path.read_text()) for path in args.render])
        if args.json != "-":
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        text = render(record)
    else:
        objectives = () if args.direct_only else tuple(o for o in OBJECTIVES if o[0] in args.objectives)
        command = " ".join(["python -m bench.taso_gains", *(argv if argv is not None else sys.argv[1:])])
        record = {"command": command, "device": DEVICE, "max_states": args.max_states,
                  "machine": platform.machine(), "torch": torch.__version__,
                  "rule_sets": {} if args.direct_only else {k: list(v.rewrite_kinds) for k, v in
                                                           rule_sets(FUSED_WORKLOADS[0], tuple(args.rules)).items()},
                  "rows": []}

        def save(rows: list[dict[str, Any]]) -> None:
            if args.json != "-":
                Path(args.json).write_text(json.dumps({**record, "rows": rows}, indent=1) + "\n")

        record["rows"] = run(args.workloads, args.max_states, args.size, tuple(args.rules), objectives,
                             directly=not args.no_direct, save=save)
        save(record["rows"])
        text = render(record)
    print(text)
    if args.md != "-":
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
