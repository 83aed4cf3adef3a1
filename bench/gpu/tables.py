"""results.md: the run's tables from results.json's figures.

- Plans: one line per workload and limit: eager against the plan (plan.step, CUDA events)
  and the best peer under that limit, allocated and reserved peaks, the number check, the
  plan's predicted figures (the measured cost model) and simulated ones (the device's
  analytic profile), the search's states and seconds per phase.
- Peers: one line per workload and peer, against eager.
- What was not run, and why.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30


def _x(v: Any) -> str:
    return f"x{v:.3f}" if isinstance(v, (int, float)) else "-"


def _ms(entry: dict[str, Any]) -> str:
    if "median_s" not in entry:
        return "OOM" if entry.get("out_of_memory") else "-"
    return f"{entry['median_s'] * 1e3:.1f}"


def size_text(v: float) -> str:
    """Bytes in GiB, or MiB below a tenth of a GiB (a dry run's tiny sizes)."""
    return f"{v / GIB:.2f} GiB" if v >= GIB / 10 else f"{v / 2**20:.2f} MiB"


def _gib(entry: dict[str, Any], key: str) -> str:
    v = entry.get(key)
    return size_text(v) if isinstance(v, (int, float)) else "-"


def _numbers(entry: dict[str, Any]) -> str:
    n = entry.get("numbers") or {}
    if "equal" not in n:
        return n.get("unchecked", "reference" if n.get("reference") else "-")
    worst = max((v for k, v in n.items() if k in ("loss", "exp_avg", "exp_avg_sq", "updates")), default=0.0)
    verdict = "equal" if n["equal"] else ("differ (expected: " + n["why_not_exact"] + ")" if n.get("why_not_exact")
                                          else "DIFFER")
    return f"{verdict} {worst:.1e} ({n['tolerance']:.1e}, vs {n['reference']})"


def _phases(entry: dict[str, Any]) -> str:
    p = entry.get("phases") or {}
    parts = [f"{p['states']} states" if p.get("states") is not None else ""]
    by_phase = (p.get("phases") or {}).get("seconds")
    if isinstance(by_phase, dict):          # the report's own accounting, every phase
        parts += [f"{k} {v:.1f} s" for k, v in by_phase.items() if isinstance(v, (int, float))]
    else:
        for key, label in (("calibration_s", "calibration"), ("search_s", "search"), ("verification_s", "verification")):
            if isinstance(p.get(key), (int, float)):
                parts.append(f"{label} {p[key]:.1f} s")
    return ", ".join(x for x in parts if x) or "-"


def _peer(best: dict[str, Any] | None) -> str:
    if not best or best.get("name") is None:
        return (best or {}).get("why", "-")
    mark = "" if best.get("meets") else " (misses)"
    return f"{best['name']}{mark}: {_x(best.get('allocated'))} mem, {_x(best.get('time'))} time"


def _simulated(row: dict[str, Any], limit: str, entry: dict[str, Any]) -> str:
    pred = entry.get("predicted") or {}
    text = f"{_x(pred.get('peak_ratio'))} mem, {_x(pred.get('latency_ratio'))} time"
    sim = row.get("simulated") or {}
    if isinstance(sim.get(limit), dict):
        text += f"; {sim['profile']}: {_x(sim[limit].get('peak_ratio'))} mem, {_x(sim[limit].get('latency_ratio'))} time"
    return text


def plan_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| workload | limit | eager ms | plan ms (plan.step) | time | allocated eager -> plan | "
             "reserved eager -> plan | best peer (measured) | plan beats it | numbers | "
             "predicted (measured model); simulated (profile) | search | status |", "|" + " --- |" * 13]
    for r in rows:
        e = r.get("eager") or {}
        if not r.get("limits"):
            lines.append(f"| {r.get('description', r['workload'])} | - | {_ms(e)} | | | | | | | | | | "
                         f"{r.get('error', 'no limit run')[:200]} |")
        for limit, entry in (r.get("limits") or {}).items():
            m, q = entry.get("measured") or {}, entry.get("ratios") or {}
            status = entry.get("error") or m.get("error") or entry.get("status", "")
            lines.append(
                f"| {r.get('description', r['workload'])} | {limit} <= {entry['value']:g} | {_ms(e)} | {_ms(m)} | "
                f"{_x(q.get('time'))} (wall {_x(q.get('wall'))}) | "
                f"{_gib(e, 'max_memory_allocated')} -> {_gib(m, 'max_memory_allocated')} ({_x(q.get('allocated'))}) | "
                f"{_gib(e, 'max_memory_reserved')} -> {_gib(m, 'max_memory_reserved')} ({_x(q.get('reserved'))}) | "
                f"{_peer(entry.get('best_peer'))} | {entry.get('beats_best_peer', '-')} | {_numbers(m)} | "
                f"{_simulated(r, limit, entry)} | {_phases(entry)} | {str(status)[:160]} |")
    return lines


def peer_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| workload | configuration | ms | time | allocated | reserved | numbers |", "|" + " --- |" * 7]
    for r in rows:
        e = r.get("eager")
        if e is not None:
            lines.append(f"| {r.get('description', r['workload'])} | eager | {_ms(e)} | x1 | "
                         f"{_gib(e, 'max_memory_allocated')} | {_gib(e, 'max_memory_reserved')} | "
                         f"{e.get('error') or _numbers(e)} |")
        for name, p in (r.get("peers") or {}).items():
            q = p.get("ratios") or {}
            lines.append(f"| {r.get('description', r['workload'])} | {name} | {_ms(p)} | {_x(q.get('time'))} | "
                         f"{_gib(p, 'max_memory_allocated')} ({_x(q.get('allocated'))}) | "
                         f"{_gib(p, 'max_memory_reserved')} ({_x(q.get('reserved'))}) | "
                         f"{p.get('error') or _numbers(p)} |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    rows = results.get("rows", [])
    device = results.get("device") or "no device yet"
    measured = ("dry run on the CPU: peaks from the CPU allocator's events plus the bytes the caller holds, "
                "times by perf_counter" if device.startswith("cpu") else
                "peaks by torch.cuda.max_memory_allocated / max_memory_reserved over one step, times by CUDA events")
    head = [f"# python -m bench.gpu: {device}", "",
            f"Size {results.get('size')}, deadline {results.get('deadline_s')} s, {results.get('elapsed_s')} s "
            f"elapsed, {len(rows)} of {len(results.get('time_plan', []))} workloads reported. Measured: {measured} "
            "(median); predicted: the plan report's (cost model measured on the device); simulated: the "
            "device's analytic profile.", "", "## Eager, the plan and the best peer", ""]
    skipped = [f"- {r['workload']}: {s}" for r in rows
               for s in (r.get("skipped") or (r.get("slot") or {}).get("skipped", []))]
    skipped += [f"- {r['workload']}: {r['error']}" for r in rows if r.get("error") and not r["error"].startswith("not run")]
    return "\n".join(head + plan_lines(rows) + ["", "## Peers", ""] + peer_lines(rows)
                     + ["", "## Not run, cut short or failed", ""] + (skipped or ["- nothing"])) + "\n"
