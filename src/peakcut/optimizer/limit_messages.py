"""The sentences a LimitNotMet carries: why the search's best plan misses the limit, or why no
candidate plan met it when run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peakcut.optimizer.optimized import Optimized
from peakcut.optimizer.verify import Verdict
from peakcut.units import format_bytes, format_seconds


def whole_op(report: dict[str, Any]) -> str:
    """The whole-op floor's sentence for LimitNotMet (held_floor.whole_op_floor), or ''."""
    whole = report.get("whole_op_floor")
    return f"; {whole['text']}" if whole else ""


def search_shortfall(found: Optimized, budget: float) -> str:
    """Why the search's best plan misses the limit: its figure, the limit, the search's
    effort, what stands at its peak and the whole-op floor; or that the limit is below what
    the step holds between steps (not searched)."""
    mode = found.objective.mode
    what = "peak" if mode == "memory" else "latency"
    have = format_bytes(found.best.peak_bytes) if mode == "memory" else format_seconds(found.best.latency_s)
    want = format_bytes(found.objective.limit) if mode == "memory" else format_seconds(found.objective.limit)
    if found.arena is not None and mode == "memory":
        what, have = "arena", f"{format_bytes(found.arena.needed_bytes)} held + arena + unplanned"
    r = found.result
    why = (f"{what} limit not met: best {have}, limit {want} ({r.states} states searched in "
           f"{r.seconds:.3g} s of a {budget:.3g} s budget; stopped: {r.stopped}); the best plan is on "
           "this error's .plan")
    standing = found.report.get("peak_standing")
    if standing is not None:
        why += f"; {standing['text']}"
    why += whole_op(found.report)
    unreachable = found.report.get("unreachable")
    if unreachable:
        why = (f"{what} limit not met, not searched: {unreachable['text']}. The untransformed step is on this "
               "error's .plan")
    return why


def none_ran(verdict: Verdict, rejected: Sequence[tuple[str, str]], untransformed: str) -> str:
    """No candidate plan ran and computed eager's numbers: each one's reason (`untransformed`
    names the captured step's candidate)."""
    reasons = "; ".join([*(f"{n}: numbers differ from eager's: {w}" for n, w in rejected),
                         *(f"{n}: {w}" for n, w in verdict.failed)])
    captured = (" (the untransformed step too: the captured step does not compute what the eager step does)"
                if any(n == untransformed for n, _ in rejected) else "")
    return (f"no candidate plan can be kept: none of them ran and computed eager's numbers"
            f"{captured} ({reasons}); the plan on this error's .plan is unverified and may compute "
            "other numbers; the check's figures are on .measured['numbers']")


def measured_shortfall(verdict: Verdict, mode: str, rejected: Sequence[tuple[str, str]]) -> str:
    """No candidate plan meets the limit when run: the limit, eager's and each candidate's
    measured figures, and those left out for their numbers."""
    what = "time" if mode == "latency" else "peak"
    figures = "; ".join(f"{c.name}: median {format_seconds(c.median_s)} (x{c.ratio:.3f} eager), peak "
                        f"{format_bytes(c.peak_bytes)}" for c in verdict.candidates)
    limit = f"x{verdict.limit:.3f} eager's time" if mode == "latency" else format_bytes(verdict.limit)
    eager_m = verdict.eager
    why = (f"measured {what} limit not met: no candidate plan meets {limit} when run ({len(eager_m.times)} "
           f"interleaved rounds; eager median {format_seconds(eager_m.median_s)}, peak "
           f"{format_bytes(eager_m.peak_bytes)}; {figures}); the nearest plan is on this error's .plan and "
           "the figures on .measured")
    if rejected:
        why += "; left out, their numbers differ from eager's: " + "; ".join(f"{n}: {w}" for n, w in rejected)
    return why
