"""The medium table: markdown for BENCHMARKS.md, the checks of issue 16, Pareto plots."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from bench.measured.configs import config_names
from bench.peers.plots import label_pareto_axes
from peakcut.optimizer.verify import noise_band

BENCHMARKS = Path(__file__).parents[2] / "BENCHMARKS.md"
START, END = "<!-- bench.measured: start -->", "<!-- bench.measured: end -->"
TRANSFORMERS = ("bert-base", "vit-base", "gpt-neo-1.3b", "btlm-3b")
LATENCY_LIMIT, MEMORY_LIMIT = 1.10, 0.5


def predicted(report: dict[str, Any]) -> dict[str, Any]:
    """The plan report's figures the table shows (predicted, and the verification's floor)."""
    v = report.get("verification", {})
    floor = next((c["ratio_to_eager"] for c in v.get("candidates", []) if c["name"] == "untransformed step"), None)
    ctx = report.get("context", {})
    refit = report.get("refit") or {}
    return {"latency_s": refit.get("latency_s", report.get("latency_s")), "search_latency_s": report.get("latency_s"),
            "peak_bytes": report.get("peak_bytes"),
            "latency_ratio": refit.get("latency_ratio", report.get("latency_ratio")),
            "search_latency_ratio": report.get("latency_ratio"), "feasible": report.get("feasible"),
            "applied": len(report.get("applied", [])), "swaps": sum("swap" in a for a in report.get("applied", [])),
            "context_factor": ctx.get("factor"), "eager_ratio": ctx.get("eager_ratio"),
            "context_skipped": ctx.get("skipped"),
            "floor": floor, "floor_refit": refit.get("floor"), "floor_rounds": refit.get("floor_rounds"),
            "verification": v.get("skipped") or v.get("chosen"),
            "verify_seconds": v.get("seconds"), "search_seconds": report.get("search", {}).get("total_seconds")}


def _ratio(c: dict[str, Any]) -> float:
    return statistics.median(t / e for t, e in zip(c["times"], c["eager_times"], strict=True))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _cells(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        for c in run["cells"]:
            out.setdefault(c["workload"], {})[c["name"]] = c
    return out


def _environments(runs: list[dict[str, Any]]) -> str:
    """Each environment once, with the minutes every workload took in it."""
    by_env: dict[str, list[str]] = {}
    for r in runs:
        by_env.setdefault(r["env"], []).append(f"{', '.join(r['workloads'])} {r['seconds'] / 60:.1f} min")
    return "; ".join(f"{env} ({', '.join(times)})" for env, times in by_env.items())


def markdown(runs: list[dict[str, Any]]) -> str:
    cells = _cells(runs)
    lines = ["Command: `python -m bench.measured` (bench/measured; raw cells in bench/measured/results.json, "
             "Pareto plots in docs/measured/). All figures measured on this CPU: " + _environments(runs) + ".",
             "",
             "Cell: median over the rounds of time / eager's time in the same round (min-max), and the peak in GiB "
             "(x eager). Eager: its median step time and peak; the noise band (interquartile range / median "
             "of eager's runs in all rounds) in brackets, and what it holds between steps (parameters, buffers, "
             "AdamW moments, batch) in GiB.", "",
             "| workload | " + " | ".join(config_names()) + " |", "|---|" + "---|" * len(config_names())]
    for w, row in cells.items():
        eager = row.get("eager")
        if eager is None:
            continue
        out = [w]
        for name in config_names():
            c = row.get(name)
            if c is None:
                out.append("")
            elif c["error"].startswith("Refused: "):
                out.append(c["error"].removeprefix("Refused: "))
            elif c["error"]:
                out.append(f"failed: {c['error'][:60]}")
            elif name == "eager":
                held = f" (held {_gib(c['held_bytes'])})" if c.get("held_bytes") else ""
                out.append(f"{statistics.median(c['times']):.2f} s [{noise_band(c['times']):.2f}], "
                           f"{_gib(c['peak_bytes'])} GiB{held}")
            else:
                rs = [t / e for t, e in zip(c["times"], c["eager_times"], strict=True)]
                out.append(f"x{_ratio(c):.2f} ({min(rs):.2f}-{max(rs):.2f}), {_gib(c['peak_bytes'])} "
                           f"(x{c['peak_bytes'] / eager['peak_bytes']:.2f})")
        lines.append("| " + " | ".join(out) + " |")
    lines += ["", *peakcut_table(cells), "", *checks(cells)]
    return "\n".join(lines)


def peakcut_table(cells: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    lines = ["peakcut's plans: predicted (the calibrated per-op model's ratio of plan to untransformed step, "
             "times the floor: the fastest untransformed run / the fastest eager run over the calibration's and "
             "the verification's rounds; at the level eager "
             "measured in the verification's rounds; the search's own figure in brackets) against "
             "measured in this table's rounds, eager's median in the plan's rounds and in all of the workload's "
             "(how far the machine's speed moved), the numbers against eager's over 2 steps, and the floor (the "
             "untransformed generated program / eager, median per round of the verification; the refit's floor and "
             "its rounds in brackets).", "",
             "| workload | plan | predicted s | measured s (median) | error | eager s: these rounds / all | "
             "predicted / measured x eager | "
             "limit met (measured) | numbers "
             "(max rel. diff; tolerance) | floor | context factor | rewrites (swaps) | search s / verify s / whole call s "
             "(time budget) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w, row in cells.items():
        eager = row.get("eager")
        for name, c in row.items():
            if not name.startswith("peakcut") or c["error"] or eager is None:
                continue
            p, n = c["predicted"], c["numbers"]
            measured = statistics.median(c["times"])
            err = (p["latency_s"] / measured - 1) if p.get("latency_s") else float("nan")
            worst = max(n[k]["max_rel"] for k in ("loss", "update", "moments"))
            floor = f"x{p['floor']:.3f}" if p.get("floor") else "n/a"
            if p.get("floor_refit"):
                floor += f" (x{p['floor_refit']:.3f}, {p['floor_rounds']} rounds)"
            search = f" ({p['search_latency_s']:.3f})" if p.get("search_latency_s", p["latency_s"]) != p["latency_s"] else ""
            drift = f"{statistics.median(c['eager_times']):.3f} / {statistics.median(eager['times']):.3f}"
            lines.append(f"| {w} | {name} | {p['latency_s']:.3f}{search} | {measured:.3f} | {err:+.1%} | {drift} | "
                         f"{_ratios(c)} | "
                         f"{'yes' if meets(c, eager) else 'NO'} | {_numbers(n, worst)} | {floor} | {_context(p)} | "
                         f"{p['applied']} ({p['swaps']}) | {p['search_seconds']} / {p['verify_seconds']} / "
                         f"{c['setup_seconds']:.0f}{_budget(c)} | "
                         f"{c['note'][:80]} |")
    return lines


def _numbers(n: dict[str, Any], worst: float) -> str:
    """ok / DIFFER, the largest relative difference and the tolerance; where tensors were over
    it and the float64 referee judged them, how many and the worst plan / eager error ratio."""
    text = f"{'ok' if n['ok'] else 'DIFFER'} ({worst:.1e}; {n['tolerance']:.1e})"
    judged = [j for j in n.get("over_tolerance", []) if "plan_error" in j]
    if judged:
        ratio = max(j["plan_error"] / j["eager_error"] if j["eager_error"] > 0 else math.inf for j in judged)
        text += (f"; {len(judged)} over it, each within {ratio:.1f}x eager's own error against float64 eager"
                 if n["ok"] else f"; {len(judged)} over it, {sum(not j['ok'] for j in judged)} farther from "
                 "float64 eager than eager")
    elif (n.get("referee") or "").startswith("float64 eager not run"):
        text += f"; {len(n.get('over_tolerance', []))} over it, unjudged ({n['referee']})"
    return text


def _context(p: dict[str, Any]) -> str:
    """The calibration's factor, or why there was none (context_skipped)."""
    skipped = p.get("context_skipped")
    return f"skipped: {skipped[:60]}" if skipped else str(p.get("context_factor"))


def _ratio_error(c: dict[str, Any]) -> float | None:
    """The plan's predicted time / the user's eager step's (the search's latency_ratio) against
    the median of its measured time / eager's in the same rounds: the model's error where the
    machine's speed drifts between the calibration and the rounds (both ratios move alike)."""
    predicted = c["predicted"].get("latency_ratio")
    return None if not predicted else predicted / _ratio(c) - 1


def _ratios(c: dict[str, Any]) -> str:
    err = _ratio_error(c)
    return "n/a" if err is None else f"x{c['predicted']['latency_ratio']:.3f} / x{_ratio(c):.3f} ({err:+.1%})"


def _budget(c: dict[str, Any]) -> str:
    return f" ({c['budget_seconds']:.0f})" if c.get("budget_seconds") else ""


def meets(c: dict[str, Any], eager: dict[str, Any]) -> bool:
    """The cell's limit, measured: latency within 1.10 x eager widened by the noise band of
    the same rounds; memory at most 0.5 x eager's measured peak (host copies counted: on a
    CPU they are the same memory)."""
    if "latency" in c["name"]:
        return _ratio(c) <= LATENCY_LIMIT * (1 + noise_band(c["eager_times"]))
    return c["peak_bytes"] + c["host_bytes"] <= MEMORY_LIMIT * eager["peak_bytes"]


BELOW = 0.01
"""How far below the best torch.compile budget's peak a plan must be to count, as a fraction
of eager's peak: an untransformed plan can sit a few bytes under compile's (BTLM-3B at
medium size: 12 B), which is no saving."""


def beats_compile(plan: dict[str, Any], row: dict[str, dict[str, Any]]) -> bool:
    """The plan's peak is below the best torch.compile budget's (the lowest peak; the faster
    of equal ones) by at least BELOW of eager's peak, at equal or lower measured time (within
    eager's noise band in the same rounds)."""
    compiled = [c for n, c in row.items() if n.startswith("compile") and not c["error"]]
    if not compiled or "eager" not in row:
        return False
    best = min(compiled, key=lambda c: (c["peak_bytes"], _ratio(c)))
    return (plan["peak_bytes"] <= best["peak_bytes"] - BELOW * row["eager"]["peak_bytes"]
            and _ratio(plan) <= _ratio(best) + noise_band(plan["eager_times"]))


def checks(cells: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Issue 16's done-when, one line each, from the cells."""
    lat = [(w, r[n]) for w, r in cells.items() for n in r if n.startswith("peakcut latency") and not r[n]["error"]]
    plans = [(w, c) for w, r in cells.items() for n, c in r.items() if n.startswith("peakcut") and not c["error"]]
    met = sum(meets(c, cells[w]["eager"]) for w, c in plans)
    same = sum(c["numbers"].get("ok", False) for _, c in plans)
    close = sum(abs(c["predicted"]["latency_s"] / statistics.median(c["times"]) - 1) <= 0.10 for _, c in plans)
    close_ratio = sum(abs(e) <= 0.10 for e in (_ratio_error(c) for _, c in plans) if e is not None)
    small = [w for w, c in lat if w in TRANSFORMERS and c["peak_bytes"] <= 0.6 * cells[w]["eager"]["peak_bytes"]]
    held = [f"{w} x{cells[w]['eager']['held_bytes'] / cells[w]['eager']['peak_bytes']:.2f}"
            for w, _ in lat if w in TRANSFORMERS and cells[w]["eager"].get("held_bytes")]
    beats = [w for w, c in lat if beats_compile(c, cells[w])]
    floors = [(w, c["predicted"]["floor"]) for w, c in lat if c["predicted"].get("floor")]
    timed = [c for _, c in plans if c.get("budget_seconds")]
    over = [c["setup_seconds"] / c["budget_seconds"] - 1 for c in timed if c["setup_seconds"] > c["budget_seconds"]]
    refused = [f"{w} ({n.removeprefix('peakcut ')})" for w, r in cells.items() for n, c in r.items()
               if n.startswith("peakcut") and c["error"].startswith("Refused: ")]
    return [f"- peakcut cells meeting their limit when measured: {met} of {len(plans)} planned; "
            f"{len(refused)} refused before any search, the limit being below what the step holds between "
            f"steps on this CPU ({', '.join(refused) or 'none'}).",
            f"- plans giving eager's numbers (2 steps): {same} of {len(plans)}.",
            f"- peakcut calls (capture, calibration, search, verification) within their time budget: "
            f"{len(timed) - len(over)} of {len(timed)}" + (f" (the most over: +{max(over):.0%})" if over else "") + ".",
            f"- predicted step time within 10% of measured: {close} of {len(plans)}; as a ratio to eager's step "
            f"in the same rounds (drift of the machine's speed cancels): {close_ratio} of {len(plans)}.",
            f"- latency <= 1.10x plans at most 0.6x eager's peak on the transformers: {len(small)} of "
            f"{sum(w in TRANSFORMERS for w, _ in lat)} ({', '.join(small) or 'none'}). What every step holds "
            "between steps (parameters, buffers, AdamW moments, batch; on a CPU no plan can move it "
            f"elsewhere) / eager's peak: {', '.join(held) or 'n/a'}.",
            f"- latency <= 1.10x plans below the best torch.compile budget's peak (by at least {BELOW:.0%} of eager's) "
            f"at equal or lower time: {len(beats)} of {len(lat)} "
            f"({', '.join(beats) or 'none'}).",
            "- floor (untransformed program / eager, median per round): "
            + ", ".join(f"{w} x{f:.3f}" for w, f in floors) + "."]


def write_benchmarks(text: str, path: Path = BENCHMARKS) -> None:
    """Put `text` between the markers of BENCHMARKS.md (appended with a heading if absent)."""
    doc = path.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in doc and END in doc:
        doc = doc[:doc.index(START)] + block + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip() + "\n\n## Medium size, every peer run for real (measured on this CPU)\n\n" + block + "\n"
    path.write_text(doc)


def plots(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """One Pareto plot per workload: peak / eager against time / eager, every configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    out.mkdir(parents=True, exist_ok=True)
    for w, row in _cells(runs).items():
        eager = row.get("eager")
        if eager is None:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.8))
        for name, c in row.items():
            if c["error"]:
                continue
            x = 0.0 if name == "eager" else (_ratio(c) - 1) * 100
            ax.scatter([x], [c["peak_bytes"] / eager["peak_bytes"]], label=name,
                       marker="*" if name.startswith("peakcut") else "o", s=90 if name.startswith("peakcut") else 40)
        label_pareto_axes(ax, f"{w} (medium, measured on this CPU)",
                          "step time vs eager (%; median of per-round ratios)")
        fig.tight_layout()
        path = out / f"medium-{w}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made
