"""Memory-timeline plots (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from peakcut.ir.graph import Graph  # noqa: E402
from peakcut.memory import MemoryProfile  # noqa: E402
from peakcut.simulate.timeline import Timeline  # noqa: E402

_PHASE_COLORS = {"forward": "#dbe9f6", "loss": "#fde2c8", "backward": "#e3f1dc", "optimizer": "#efe1f3"}


def _save(fig: plt.Figure, path: str | Path) -> Path:
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_timeline(g: Graph, profile: MemoryProfile, path: str | Path, title: str) -> Path:
    """Bytes live per op (simulated), phases shaded, the peak marked; writes a PNG."""
    fig, ax = plt.subplots(figsize=(10, 4), dpi=120)
    gib = profile.timeline / 2**30
    xs = range(len(gib))
    start = 0
    phases = [g.nodes[n].phase.value for n in profile.order]
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            ax.axvspan(start, i, color=_PHASE_COLORS.get(phases[start], "#eeeeee"), lw=0)
            start = i
    ax.plot(xs, gib, color="#1f4e79", lw=1.2, label="live memory")
    ax.axhline(profile.baseline_bytes / 2**30, color="#888888", ls=":", lw=1, label="caller-held (params, state, batch)")
    ax.plot([profile.peak_index], [profile.peak_bytes / 2**30], "o", color="#c00000",
            label=f"peak {profile.peak_bytes / 2**30:.2f} GiB")
    for phase, color in _PHASE_COLORS.items():
        if phase in phases:
            ax.axvspan(0, 0, color=color, label=phase)
    ax.set_xlabel("op (execution order)")
    ax.set_ylabel("GiB (simulated)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    ax.margins(x=0)
    return _save(fig, path)


def plot_before_after(before: Timeline, after: Timeline, path: str | Path, title: str) -> Path:
    """Device memory over (simulated) time, eager vs the plan, each on its own time axis."""
    fig, ax = plt.subplots(figsize=(10, 4), dpi=120)
    for tl, label, color in ((before, "eager", "#888888"), (after, "peakcut plan", "#1f4e79")):
        ax.step(tl.times * 1e3, tl.bytes / 2**30, where="post", color=color, lw=1.2,
                label=f"{label}: peak {tl.peak_bytes / 2**30:.2f} GiB, {tl.latency_seconds * 1e3:.1f} ms")
    ax.set_xlabel(f"time (ms, simulated: {after.cost_name})")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, path)


def plot_front(points: list[tuple[float, float]], path: str | Path, title: str) -> Path:
    """The memory/latency Pareto front: (peak ratio, latency ratio) to eager, per plan."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    xs = [p for p, _ in points]
    ys = [(lat - 1) * 100 for _, lat in points]
    ax.plot(xs, ys, "o-", color="#1f4e79", label="peakcut front")
    ax.plot([1.0], [0.0], "s", color="#888888", label="eager")
    ax.set_xlabel("peak memory / eager peak (simulated)")
    ax.set_ylabel("latency overhead vs eager (%, simulated)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
