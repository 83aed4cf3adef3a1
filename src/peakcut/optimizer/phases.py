"""Where an optimize call's time went: seconds and states per phase, for the report.

    report["phases"] = {"budget_s": 90, "total_s": 88.1,
                        "seconds": {"capture": 1.2, "calibration": 9.8, "search": 47.0,
                                    "reprice": 0.9, "verification": 26.1},
                        "measuring_in_search_s": 3.1,
                        "states": {"search": 412, "verification": 3}, "search_share": 0.52}

capture: tracing the step; calibration: the user's first eager steps, measuring the step's
calls and (where they fit) the in-context rounds (optimizer.context); search: optimize_graph's
own work (re-order, root rewrites, the best-first search, the polish), of which
measuring_in_search_s went to slices of measuring the calls it priced by fitted prices
(optimizer.budget); reprice: measuring and pricing again the states that can become the plan
(optimizer.reprice); verification: the candidates run against eager
(optimizer.verification). search_share is search / budget. The phases add up to total_s
less the time between them (a few milliseconds).
"""

from __future__ import annotations

from typing import Any

ORDER = ("capture", "calibration", "search", "reprice", "verification")


def phases_entry(seconds: dict[str, float], states: dict[str, int], budget_s: float,
                 total_s: float, measuring_s: float = 0.0) -> dict[str, Any]:
    """The report's "phases" entry (module doc); phases not run are left out."""
    ordered = {k: round(seconds[k], 3) for k in ORDER if k in seconds}
    share = seconds.get("search", 0.0) / budget_s if 0 < budget_s < float("inf") else None
    return {"budget_s": budget_s, "total_s": round(total_s, 3), "seconds": ordered,
            "measuring_in_search_s": round(measuring_s, 3), "states": dict(states),
            "search_share": None if share is None else round(share, 3)}


def merged(inner: dict[str, Any] | None, seconds: dict[str, float], states: dict[str, int], budget_s: float,
           total_s: float) -> dict[str, Any]:
    """optimize_graph's phases (`inner`, or none) with the phases of the call around it."""
    found = dict(inner["seconds"]) if inner else {}
    found.update(seconds)
    counts = dict(inner["states"]) if inner else {}
    counts.update(states)
    return phases_entry(found, counts, budget_s, total_s, inner["measuring_in_search_s"] if inner else 0.0)


def phases_line(phases: dict[str, Any]) -> str:
    """One line for a terminal: 'capture 1.2 s, search 47.0 s (412 states; measuring 3.1 s),
    ...: 85.3 s of 90 s; search 52% of the budget'."""
    states = phases.get("states", {})
    parts = []
    for name, s in phases["seconds"].items():
        notes = []
        if name in states:
            notes.append(f"{states[name]} {'states' if name == 'search' else 'plans run'}")
        if name == "search" and phases.get("measuring_in_search_s"):
            notes.append(f"measuring {phases['measuring_in_search_s']:.1f} s")
        parts.append(f"{name} {s:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""))
    share = phases.get("search_share")
    tail = f"; search {share:.0%} of the budget" if share is not None else ""
    return f"{', '.join(parts)}: {phases['total_s']:.1f} s of {phases['budget_s']:g} s{tail}"
