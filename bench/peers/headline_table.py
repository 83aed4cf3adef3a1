"""The opening table's cells and markdown: per workload and profile, peakcut's plan at a latency
limit against the best configuration of every peer family (bench.peers.headline runs them).

An Entry is one configuration's simulated figures; `best_of` picks a family's best entry under
the limit (lowest peak, then lowest latency) or, when none meets it, its fastest entry, marked
over the limit; `rows` and `markdown` build the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

LIMIT = 1.10
FAMILIES: tuple[str, ...] = ("accumulate", "sac", "checkpoint", "compile", "offload")
TITLES = {"peakcut": "peakcut", "accumulate": "grad accumulation", "sac": "selective ckpt (torchtitan)",
          "checkpoint": "ckpt per block", "compile": "compile budget (aot_eager)", "offload": "ZeRO-Offload"}
AIMS = {"resnet50": 0.30, "unet": 0.30, "unetpp": 0.30}     # the rest (transformers): 0.35
TRANSFORMER_AIM = 0.35
BATCHNORM_MARK = "*"    # accumulation changes a BatchNorm model's statistics


@dataclass
class Entry:
    """One configuration of one family (or eager, or peakcut) on a workload and profile, simulated."""

    workload: str
    profile: str
    family: str            # "eager", "peakcut" or one of FAMILIES
    config: str            # "k=2", "budget 0.4 dp", "" ...
    peak_bytes: int = 0
    latency_s: float = 0.0
    note: str = ""
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)   # peakcut: states, search seconds

    @property
    def ok(self) -> bool:
        return not self.error and self.peak_bytes > 0


@dataclass(frozen=True)
class Pick:
    """A family's figure in one cell: ratios to eager, whether it meets the limit."""

    entry: Entry
    peak: float          # peak / eager peak
    latency: float       # latency / eager latency
    within: bool

    def text(self) -> str:
        e = self.entry
        label = f"{e.config}: " if e.config and e.family != "peakcut" else ""
        mark = BATCHNORM_MARK if "BatchNorm" in e.note else ""
        over = "" if self.within else " **over**"
        return f"{label}{self.peak:.1%}{mark} (x{self.latency:.3f}){over}"


def ratio(entry: Entry, eager: Entry) -> tuple[float, float]:
    """(peak, latency) of `entry` relative to eager's."""
    return entry.peak_bytes / eager.peak_bytes, entry.latency_s / eager.latency_s


def best_of(entries: Iterable[Entry], eager: Entry, limit: float = LIMIT) -> Pick | None:
    """The lowest-peak entry within `limit` (ties: the faster); else the fastest, over the limit."""
    picks = []
    for e in entries:
        if e.ok:
            peak, lat = ratio(e, eager)
            picks.append(Pick(e, peak, lat, lat <= limit + 1e-9))
    within = [p for p in picks if p.within]
    if within:
        return min(within, key=lambda p: (p.peak, p.latency))
    return min(picks, key=lambda p: (p.latency, p.peak)) if picks else None


@dataclass(frozen=True)
class Row:
    """One workload on one profile: eager, peakcut and each family's pick, and the best peer;
    matched: peakcut's lowest-peak plan at no more than the best peer's latency (a search
    under that peer's latency, where the plan under the limit is slower than the peer)."""

    workload: str
    profile: str
    eager: Entry
    peakcut: Pick | None
    peers: dict[str, Pick | None]
    matched: Pick | None = None

    @property
    def best_peer(self) -> str | None:
        within = {f: p for f, p in self.peers.items() if p is not None and p.within}
        return min(within, key=lambda f: (within[f].peak, within[f].latency)) if within else None

    @property
    def aim(self) -> float:
        return AIMS.get(self.workload, TRANSFORMER_AIM)

    def verdict(self) -> str:
        """Whether peakcut meets the aim and beats the best peer at equal or lower latency."""
        if self.peakcut is None:
            return "no peakcut figure"
        pc = self.peakcut
        parts = ["meets aim" if pc.within and pc.peak <= self.aim else f"misses aim {self.aim:.0%}"]
        best = self.best_peer
        if best is not None:
            peer = self.peers[best]
            assert peer is not None
            below = pc.within and pc.peak < peer.peak
            if below and pc.latency <= peer.latency + 1e-9:
                parts.append(f"below {TITLES[best]}, at equal or lower latency")
            elif below and self.matched is not None and self.matched.peak < peer.peak:
                m = self.matched
                parts.append(f"below {TITLES[best]}; at its latency {m.peak:.1%} (x{m.latency:.3f})")
            elif below:
                parts.append(f"below {TITLES[best]}, slower than it")
            else:
                parts.append(f"NOT below {TITLES[best]}")
        return "; ".join(parts)

    def to_match(self) -> Pick | None:
        """The best peer, where peakcut's plan under the limit holds less than it but runs
        slower (a search at that peer's latency then says whether peakcut beats it there)."""
        best = self.best_peer
        pc = self.peakcut
        if best is None or pc is None or not pc.within:
            return None
        peer = self.peers[best]
        if peer is None or pc.peak >= peer.peak or pc.latency <= peer.latency + 1e-9:
            return None
        return peer


def matched(peakcut: Iterable[Entry], eager: Entry, peer: Pick | None) -> Pick | None:
    """The lowest-peak peakcut entry at no more than `peer`'s latency."""
    if peer is None:
        return None
    at = [e for e in peakcut if e.ok and e.latency_s <= peer.entry.latency_s + 1e-12]
    return best_of(at, eager, limit=float("inf"))


def rows(entries: list[Entry], limit: float = LIMIT) -> list[Row]:
    """One row per (workload, profile) that has an eager entry, in first-seen order."""
    keys: list[tuple[str, str]] = []
    for e in entries:
        if (e.workload, e.profile) not in keys:
            keys.append((e.workload, e.profile))
    out = []
    for w, prof in keys:
        mine = [e for e in entries if e.workload == w and e.profile == prof]
        eager = next((e for e in mine if e.family == "eager" and e.ok), None)
        if eager is None:
            continue
        plans = [e for e in mine if e.family == "peakcut"]
        peers = {f: best_of([e for e in mine if e.family == f], eager, limit) for f in FAMILIES}
        row = Row(w, prof, eager, best_of(plans, eager, limit), peers)
        best = row.peers[row.best_peer] if row.best_peer else None
        out.append(replace(row, matched=matched(plans, eager, best)))
    return out


def _cell(pick: Pick | None, failed: list[Entry]) -> str:
    if pick is not None:
        return pick.text()
    return f"failed: {failed[0].error[:50]}" if failed else ""


def markdown(table: list[Row], entries: list[Entry], limit: float = LIMIT) -> str:
    """The table: one line per workload and profile; cells are peak / eager (latency / eager)."""
    head = ["workload", "profile", f"peakcut <= x{limit:.2f}"] + [TITLES[f] for f in FAMILIES] + ["best peer", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in table:
        failed = {f: [e for e in entries if e.workload == r.workload and e.profile == r.profile
                      and e.family == f and not e.ok] for f in ("peakcut", *FAMILIES)}
        cells = [r.workload, r.profile, _cell(r.peakcut, failed["peakcut"])]
        cells += [_cell(r.peers[f], failed[f]) for f in FAMILIES]
        cells += [TITLES[r.best_peer] if r.best_peer else "none within the limit", r.verdict()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(limit: float = LIMIT) -> str:
    """What the cells mean."""
    return (f"Cells: peak / eager's peak (latency / eager's latency), simulated on the named profile. Each peer "
            f"family shows its lowest-peak configuration with latency <= x{limit:.2f} (k micro-batches, "
            f"torch.compile's activation budget and solver); a family with none shows its fastest "
            f"configuration, marked **over**. {BATCHNORM_MARK}: BatchNorm model, accumulation normalises "
            f"per micro-batch (not the same numbers as eager). Aim: <= {TRANSFORMER_AIM:.0%} of eager on the "
            f"transformers, <= {AIMS['resnet50']:.0%} on the CNNs, and below the best peer.")


def detail(entries: list[Entry]) -> str:
    """Every configuration's figures (absolute and relative), for the full report."""
    lines = ["| workload | profile | family | configuration | peak GiB | peak / eager | latency ms | "
             "latency / eager | note / failure |", "|---" * 9 + "|"]
    eager = {(e.workload, e.profile): e for e in entries if e.family == "eager" and e.ok}
    for e in entries:
        base = eager.get((e.workload, e.profile))
        if not e.ok or base is None:
            lines.append(f"| {e.workload} | {e.profile} | {e.family} | {e.config} | | | | | failed: {e.error} |")
            continue
        peak, lat = ratio(e, base)
        lines.append(f"| {e.workload} | {e.profile} | {e.family} | {e.config} | {e.peak_bytes / 2**30:.2f} | "
                     f"{peak:.1%} | {e.latency_s * 1e3:.1f} | x{lat:.3f} | {e.note} |")
    return "\n".join(lines)
