"""bench.peers.headline: the opening table built from given cells, and the peer rows it runs."""

from __future__ import annotations

from bench.peers.headline import matches, merged, peer_tools
from bench.peers.headline_table import FAMILIES, LIMIT, Entry, markdown, rows

GIB = 2**30


def _entries() -> list[Entry]:
    def e(family: str, config: str, peak: float, lat: float, note: str = "", error: str = "") -> Entry:
        return Entry("unet", "h100", family, config, int(peak * GIB), lat, note, error)

    bn = "micro-batch 8; BatchNorm statistics per micro-batch (not exact)"
    return [
        e("eager", "", 10, 1.0),
        e("peakcut", "latency <= x1.10", 2.5, 1.08),
        e("accumulate", "k=2", 5.5, 1.04, bn), e("accumulate", "k=4", 3.0, 1.12, bn),
        e("sac", "", 8.0, 1.06),
        e("checkpoint", "", 3.5, 1.30), e("checkpoint", "", 0, 0, error="RuntimeError: boom"),
        e("compile", "budget 0.4 dp", 6.0, 1.09), e("compile", "budget 0.2 dp", 4.0, 1.20),
        e("offload", "", 9.0, 0.99),
    ]


def test_rows_pick_the_best_within_the_limit() -> None:
    entries = _entries()
    [row] = rows(entries)
    assert row.peakcut is not None and row.peakcut.peak == 0.25 and row.peakcut.within
    acc = row.peers["accumulate"]
    assert acc is not None and acc.entry.config == "k=2" and acc.within       # k=4 is over 1.10
    ckpt = row.peers["checkpoint"]
    assert ckpt is not None and not ckpt.within                              # its fastest, marked
    assert row.best_peer == "accumulate"
    assert row.verdict() == "meets aim; below grad accumulation, slower than it"
    table = markdown([row], entries)
    assert "k=2: 55.0%* (x1.040)" in table          # BatchNorm marked
    assert "35.0% (x1.300) **over**" in table
    assert "| unet | h100 | 25.0% (x1.080) |" in table


def test_no_peer_within_the_limit() -> None:
    entries = [e for e in _entries() if e.family in ("eager", "peakcut", "checkpoint")]
    [row] = rows(entries)
    assert row.best_peer is None
    assert all(row.peers[f] is None for f in FAMILIES if f != "checkpoint")
    assert "none within the limit" in markdown([row], entries)


def test_peer_rows_cover_every_family() -> None:
    families = {t.family for t in peer_tools(budgets=(1.0, 0.4), solvers=("dp",))}
    assert families == {"eager", *FAMILIES}
    assert sum(t.family == "accumulate" for t in peer_tools()) == 3


def test_merge_replaces_the_rerun_groups() -> None:
    old = _entries()
    new = [Entry("unet", "h100", "peakcut", "latency <= x1.10", GIB, 1.0)]
    out = merged(old, new)
    assert [e.peak_bytes for e in out if e.family == "peakcut"] == [GIB]
    assert len(out) == len(old)


def test_a_slower_plan_asks_for_a_search_at_the_peers_latency() -> None:
    """peakcut's 25% at x1.08 holds less than accumulation's 55% at x1.04 but runs slower: the
    run asks for a search under x1.04, and a plan found there carries the verdict."""
    entries = _entries()
    [(workload, profile, limit, config)] = matches(entries, LIMIT)
    assert (workload, profile, round(limit, 3)) == ("unet", "h100", 1.04)
    assert config == "latency <= x1.040 (grad accumulation's)"
    entries.append(Entry("unet", "h100", "peakcut", config, int(4.0 * GIB), 1.035))
    [row] = rows(entries)
    assert row.peakcut is not None and row.peakcut.peak == 0.25          # the column keeps the lowest
    assert row.matched is not None and row.matched.peak == 0.40
    assert row.verdict() == "meets aim; below grad accumulation; at its latency 40.0% (x1.035)"
    assert matches(entries, LIMIT) == [("unet", "h100", limit, config)]   # still slower: asked again
    entries[-1].peak_bytes = int(6.0 * GIB)                              # 60%: above the peer's 55%
    [row] = rows(entries)
    assert row.verdict() == "meets aim; below grad accumulation, slower than it"
