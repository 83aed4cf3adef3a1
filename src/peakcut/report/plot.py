"""Memory-timeline plots (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from peakcut.analysis.memory import MemoryProfile  # noqa: E402
from peakcut.ir.graph import Graph  # noqa: E402

_PHASE_COLORS = {"forward": "#dbe9f6", "loss": "#fde2c8", "backward": "#e3f1dc", "optimizer": "#efe1f3"}


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
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
