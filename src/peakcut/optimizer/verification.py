"""optimize's verification: the candidate plans run against the user's eager step
(peakcut.optimizer.verify), the one kept and the verdict in the report; and the host
allocator set up for a CPU model's measurements."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.optimizer.arena import arena_entries, state_arena
from peakcut.optimizer.context import ContextCalibration, refit
from peakcut.optimizer.limit_messages import measured_shortfall, none_ran
from peakcut.optimizer.optimized import Optimized
from peakcut.optimizer.report import estimate, plan_entries
from peakcut.optimizer.shares import VERIFY_CANDIDATES, VERIFY_SKIP_BELOW
from peakcut.optimizer.state import State
from peakcut.optimizer.verify import (
    SHORT_ROUNDS,
    EagerStep,
    candidate_name,
    choose,
    model_device,
    programs_for,
    runs_needed,
)
from peakcut.runtime.host_allocator import keep_freed_host_memory


def host_memory(model: torch.nn.Module, keep: bool) -> tuple[str, bool]:
    """Apply keep_freed_host_memory for a CPU model when asked; what was done, for the report,
    and whether glibc now keeps freed memory."""
    if model_device(model).type != "cpu":
        return "not a CPU model: left alone", False
    if not keep:
        return "left alone (keep_host_memory=False)", False
    if keep_freed_host_memory():
        return "glibc malloc keeps freed memory (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)", True
    return "left alone: not glibc", False


def verify_seconds(step_s: float, fingerprint_s: float, rounds: int = SHORT_ROUNDS,
                   referenced: bool = False) -> float:
    """What verification takes with steps of `step_s`: eager and one plan, `rounds` rounds
    each (default: the fewest), and the numbers check's fingerprints of both (fingerprint_s
    each); `referenced`: eager's numbers were taken already (verify.EagerReference), its run
    and fingerprint left out. A latency limit's reserve runs only where the plan misses (verify)."""
    return (runs_needed(2, rounds) - referenced) * step_s + (2 - referenced) * fingerprint_s


ARENA_LAYOUT_S = 0.5       # the greedy layout of each other candidate's arena (the best's is the search's)


def verified(found: Optimized, seconds: float, model: torch.nn.Module, batch: Any, eager: EagerStep,
             opt: torch.optim.Optimizer | None,
             calibration: ContextCalibration | None, fingerprint_s: float,
             host_keeps_freed: bool = False) -> tuple[State, bool, str, ArenaPlan | None]:
    """The candidate that meets the limit when run (peakcut.optimizer.verify), whether one
    did, why not, and the arena plan it ran with (where found.arena says the plan has one:
    each candidate runs with its own); the verdict goes into found.report["verification"]
    (fingerprint_s: the numbers check's fingerprints of one run, numbers.check_seconds;
    host_keeps_freed: the CPU allocator the reserved bytes of another candidate kept are
    predicted for)."""
    mode = found.objective.mode
    t0 = time.perf_counter()
    report = found.report
    predicted = found.reference_s
    # what a step takes, for sizing the rounds: the calibration's figure (what optimize kept
    # this time on), else the model's
    step_s = calibration.eager_step_s if calibration is not None and calibration.eager_step_s > 0 else predicted
    least = verify_seconds(step_s, fingerprint_s,
                           referenced=calibration is not None and calibration.reference is not None)
    if seconds < VERIFY_SKIP_BELOW * least:
        report["verification"] = {"skipped": f"{seconds:.1f} s of the time budget left; running eager and one "
                                  f"plan takes about {least:.1f} s (raise time_budget)"}
        warnings.warn(f"peakcut: the plan was not verified by running it: {report['verification']['skipped']}; "
                      "its limit is met as predicted only", stacklevel=6)
        return found.best, found.feasible, "", found.arena
    candidates = found.candidates(programs_for(step_s, seconds, VERIFY_CANDIDATES, reserve=mode == "latency"))
    # with an arena, each candidate runs with its own (the best with the one the search priced,
    # the others laid out as it was, on the search's probe verdicts)
    arenas: list[bool | ArenaPlan] = [] if found.arena is None or found.deriver is None else [
        found.arena if s is found.best else state_arena(s, found.deriver.workspace, ARENA_LAYOUT_S, found.probes)
        for s in candidates]
    state, verdict, placed = choose(candidates, found.captured, found.objective, predicted, model, batch, eager, opt,
                                    max(0.0, seconds - (time.perf_counter() - t0)), step_s, arenas,
                                    None if calibration is None else calibration.reference)
    report["verification"] = dict(verdict.report(mode), seconds=round(time.perf_counter() - t0, 3))
    if state is not found.best:
        report.update(plan_entries(state, found.eager, found.eager_ratio),
                      search=dict(report["search"], compact_estimate=estimate(state)))
        report.update(arena_entries(state.program, state.order, found.cost,
                                    found.deriver.workspace if found.deriver is not None else "auto", 0.0,
                                    host_keeps_freed))
        if placed is not None:
            report["arena"] = placed.as_dict()
    root = found.captured
    refitted = refit(state.latency_s / root.latency_s if root.latency_s > 0 else 0.0, calibration, verdict,
                     candidate_name(root, root))
    if refitted is not None:
        report["refit"] = refitted
    if verdict.chosen is not None:
        m = verdict.candidates[verdict.chosen]
        report["feasible"] = True
        report.pop("whole_op_floor", None)       # a floor of the simulated bytes, which the run undercut
        report["measured"] = dict(m.as_dict(), latency_ratio=m.ratio, peak_ratio=m.peak_bytes / verdict.eager.peak_bytes)
        return state, True, "", placed
    report["feasible"] = False
    rejected = () if verdict.numbers is None else verdict.numbers.rejected
    if not verdict.candidates:
        return state, False, none_ran(verdict, rejected, candidate_name(found.captured, found.captured)), placed
    return state, False, measured_shortfall(verdict, mode, rejected), placed
