"""Markdown tables: rows = tools, columns = workloads; cells relative to eager."""

from __future__ import annotations

import os
import platform
import statistics
import sys

import torch

from bench.peers.results import Cell

MIB = 2**20
PROFILES = ("rtx3090", "h100", "h200")
MEASURED = ("tiny", "medium")     # sizes measured on this machine; "paper" is simulated


def environment() -> str:
    """Command and environment line printed above every table."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import transformers
        hf = f", transformers {transformers.__version__}"
    except ImportError:
        hf = ""
    cmd = "python -m bench.peers " + " ".join(sys.argv[1:])
    return (f"Command: `{cmd.strip()}`. Environment: torch {torch.__version__}{hf}, {cpu}, "
            f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, Python {platform.python_version()}.")


def _by(cells: list[Cell]) -> dict[tuple[str, str], Cell]:
    return {(c.workload, c.tool): c for c in cells}


def _short(reason: str, limit: int = 60) -> str:
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _eager_cell(c: Cell, size: str) -> str:
    if not c.ok:
        return f"failed: {_short(c.error)}"
    if size in MEASURED:
        t = [x * 1e3 for x in c.times]
        return f"{c.peak_bytes / MIB:.2f} MiB, {statistics.median(t):.1f} ms"
    lat = "/".join(f"{c.latency[p] * 1e3:.0f}" if p in c.latency else "-" for p in PROFILES)
    return f"{c.peak_bytes / 2**30:.2f} GiB, {lat} ms"


def _ratio_cell(c: Cell, eager: Cell | None, size: str) -> str:
    if not c.ok:
        return f"failed: {_short(c.error)}"
    if eager is None or not eager.ok:
        return "no eager baseline"
    peak = f"{c.peak_bytes / eager.peak_bytes:.2f}×"
    if size in MEASURED:
        over = [f"{c.seconds() / eager.seconds() - 1:+.0%}"]
    else:
        over = [f"{c.seconds(p) / eager.seconds(p) - 1:+.0%}" if p in c.latency and p in eager.latency else "-"
                for p in PROFILES]
    return f"{peak} / {'/'.join(over)}"


def summary_table(cells: list[Cell], size: str, workloads: list[str], tools: list[str]) -> str:
    """Peak ratio vs eager / latency overhead vs eager, per tool (rows) and workload (columns)."""
    by = _by(cells)
    head = "| tool | " + " | ".join(workloads) + " |"
    rows = [head, "|---" * (len(workloads) + 1) + "|"]
    for tool in tools:
        out = []
        for w in workloads:
            c = by.get((w, tool))
            if c is None:
                out.append("")
            elif tool == "eager":
                out.append(_eager_cell(c, size))
            else:
                out.append(_ratio_cell(c, by.get((w, "eager")), size))
        rows.append(f"| {tool} | " + " | ".join(out) + " |")
    return "\n".join(rows)


def detail_table(cells: list[Cell], size: str) -> str:
    """Every cell with absolute numbers, noise and the full failure reason."""
    if size in MEASURED:
        rows = ["| workload | tool | peak bytes | peak repeats equal | step ms min / median / max | "
                "caller-held bytes | warm-up+compile s | note / failure |",
                "|---|---|---|---|---|---|---|---|"]
        for c in cells:
            if c.ok:
                t = [x * 1e3 for x in c.times]
                rows.append(f"| {c.workload} | {c.tool} | {c.peak_bytes:,} | "
                            f"{'yes' if len(set(c.peaks)) == 1 else 'NO: ' + ', '.join(map(str, c.peaks))} | "
                            f"{min(t):.1f} / {statistics.median(t):.1f} / {max(t):.1f} | {c.baseline_bytes:,} | "
                            f"{c.setup_seconds:.1f} | {c.note} |")
            else:
                rows.append(f"| {c.workload} | {c.tool} | | | | | | failed: {c.error} |")
        return "\n".join(rows)
    rows = ["| workload | tool | nodes | peak GiB | caller-held GiB | " + " | ".join(f"{p} ms" for p in PROFILES)
            + " | capture s | note / failure |", "|---" * (7 + len(PROFILES)) + "|"]
    for c in cells:
        if c.ok:
            lat = " | ".join(f"{c.latency[p] * 1e3:.1f}" if p in c.latency else "-" for p in PROFILES)
            rows.append(f"| {c.workload} | {c.tool} | {c.nodes} | {c.peak_bytes / 2**30:.3f} | "
                        f"{c.baseline_bytes / 2**30:.3f} | {lat} | {c.setup_seconds:.1f} | {c.note} |")
        else:
            rows.append(f"| {c.workload} | {c.tool} | | | | " + "| " * len(PROFILES) + f"| failed: {c.error} |")
    return "\n".join(rows)


HEADINGS = {
    "tiny": ("Tiny sizes, measured on this CPU",
             "Cells: peak ratio vs eager / step-time overhead vs eager (median). Eager row: absolute "
             "peak and median step time. Peak = c10 CPU allocator running sum under torch.profiler "
             "over one full step (forward, loss, backward, AdamW foreach=False, zero_grad) plus the "
             "caller-held parameters, buffers, optimizer state and batch. Times: median of the timed "
             "runs after warm-up (compile excluded); min/median/max in the detail table."),
    "medium": ("Medium sizes, measured on this CPU",
               "Cells: peak ratio vs eager / step-time overhead vs eager (median, wall clock). Eager row: "
               "absolute peak and median step time. Peak as for the tiny sizes: allocator events under "
               "torch.profiler over one full step plus the caller-held bytes; glibc's malloc keeps freed "
               "memory (as under bench.measured). Gradient accumulation: the same batch as k micro-batches, "
               "one update; BatchNorm models then normalise per micro-batch (not exact)."),
    "paper": ("Paper sizes, simulated",
              "Cells: peak ratio vs eager / latency overhead vs eager on rtx3090/h100/h200. Eager row: "
              "absolute peak and latency. Peak: peakcut's memory simulator (peakcut.memory.simulate, capture "
              "order, CPU workspace model) on each peer's step captured over FakeTensors, AdamW update "
              "included (ZeRO-Offload: the largest of its per-profile peaks); latency: simulate_timeline with "
              "the analytic rtx3090, h100 and h200 profiles. Simulated, not measured."),
}


def markdown(cells: list[Cell], size: str, meta: dict) -> str:
    """One size's section; meta: env (environment line), seconds, workloads, tools (row order)."""
    title, text = HEADINGS[size]
    workloads, tools = meta["workloads"], meta["tools"]
    return "\n\n".join([
        f"## {title}", meta["env"] + f" Run time: {meta['seconds'] / 60:.1f} min.", text,
        summary_table(cells, size, workloads, tools),
        f"<details><summary>All {size} cells (absolute numbers, noise, failure reasons)</summary>\n\n"
        + detail_table(cells, size) + "\n\n</details>",
    ]) + "\n"
