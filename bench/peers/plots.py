"""Per-workload Pareto plots: peak ratio vs latency overhead, one curve per tool."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.peers.results import Cell

PLOT_DIR = Path(__file__).parent / "plots"


def label_pareto_axes(ax: Any, title: str, xlabel: str) -> None:
    """Title, axis labels, grid and legend of a peak-vs-time Pareto plot."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("peak memory / eager peak")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _order(label: str) -> float:
    if label.startswith("k="):
        return float(label[2:])
    return -float(label) if label else 0.0


def _points(cells: list[Cell], profile: str) -> dict[str, list[tuple[float, float, str]]]:
    eager = next((c for c in cells if c.tool == "eager" and c.ok), None)
    curves: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    if eager is None:
        return curves
    for c in cells:
        if not c.ok:
            continue
        if profile and (profile not in c.latency or profile not in eager.latency):
            continue
        x = c.seconds(profile) / eager.seconds(profile) - 1
        y = c.peak(profile) / eager.peak(profile)
        label = (c.tool.split(" budget ")[1].split()[0] if " budget " in c.tool
                 else c.tool.split()[-1] if c.curve == "grad accumulation" else "")
        curves[c.curve].append((x, y, label))
    return curves


def pareto_plot(cells: list[Cell], workload: str, size: str, out_dir: Path = PLOT_DIR) -> Path | None:
    """Save <size>-<workload>.png; None when there is no eager baseline to compare with."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = [""] if size != "paper" else ["rtx3090", "h100", "h200"]
    mine = [c for c in cells if c.workload == workload and c.size == size]
    if not any(c.tool == "eager" and c.ok for c in mine):
        return None
    fig, axes = plt.subplots(1, len(profiles), figsize=(6.5 * len(profiles), 4.8), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        for curve, pts in sorted(_points(mine, profile).items()):
            pts.sort(key=lambda p: _order(p[2]))  # budget 1.0 -> 0.0, k=2 -> 8
            xs, ys = [p[0] * 100 for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, marker="o", linestyle="-" if len(pts) > 1 else "", label=curve)
            for x, y, label in zip(xs, ys, (p[2] for p in pts), strict=True):
                if label:
                    ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        where = "measured on CPU" if size != "paper" else f"simulated, {profile}"
        label_pareto_axes(ax, f"{workload} ({size}, {where})", "latency overhead vs eager (%)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{size}-{workload}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
