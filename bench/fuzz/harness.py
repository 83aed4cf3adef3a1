"""One fuzz case: capture, a random walk over the search's moves, the program against eager.

The walk starts at the search's root (the captured step, re-ordered for memory) and takes
`moves` random moves of peakcut.optimizer.children, the same moves the search makes from
every rule of peakcut.rules.RULES: a kind first (uniformly among the kinds that have a move
here), then one of its moves. A move a rule refuses when it is built (DeriveError) counts as
refused and the walk goes on from the same state. The state reached is run next to eager for
3 steps with the same seed for random ops (peakcut.check_equivalence), and its peak measured
from the CPU allocator's events is compared with the simulated one (within PEAK_TOLERANCE).

Tolerance: rounding of a reordered or split reduction of length K differs by about
u * sqrt(K) (peakcut.runtime.equivalence.rounding_tolerance), carried through the steps; K is bounded by the
largest tensor of the step. float32 cases use SGD: Adam's update divides by sqrt(v), which
turns a rounding-sized gradient (a zero up to rounding) into an update of about lr, so the
same float32 step can differ by lr in a parameter without any error (float64 keeps that far
below the tolerance).
"""

from __future__ import annotations

import copy
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import peakcut
from bench.fuzz.blocks import flip
from bench.fuzz.loop import autocast_tolerance, run_user_loop
from bench.fuzz.models import Case
from peakcut.codegen.program import Step
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import DeriveError
from peakcut.runtime.equivalence import check_equivalence, rounding_tolerance

STEPS = 3
PEAK_TOLERANCE = 0.05    # simulated against measured peak: the spine's tolerance (tests/runtime)
DEVICE = "h200"      # a GPU profile: swaps and offload are priced as freeing memory, so they are tried


@dataclass
class Outcome:
    """What one case did: the moves applied and refused per kind, and how it ended."""

    seed: int
    description: str
    tags: tuple[str, ...] = ()         # the case's kind (bench.fuzz.models.Case.tags)
    status: str = "ok"                 # ok | mismatch (numbers) | memory (peak) | crash
    applied: Counter = field(default_factory=Counter)     # move kind -> times applied
    refused: Counter = field(default_factory=Counter)     # move kind -> times a rule refused it
    steps: list[str] = field(default_factory=list)        # the applied moves' descriptions
    detail: str = ""
    seconds: float = 0.0
    worst: float | None = None    # user-loop cases: largest difference / allowed (bench.fuzz.loop)


def run_case(case: Case, moves: int = 3) -> Outcome:
    """Capture `case`, walk `moves` random moves, compare the program with eager."""
    t0 = time.perf_counter()
    out = Outcome(case.seed, case.description, case.tags)
    rng = case.rng
    where = "capture"
    try:
        if case.loop is not None:
            g = peakcut.capture(case.model, case.batch, case.loss_fn, case.loop.make_optimizer(case.model),
                                keep_grads=True, max_grad_norm=case.loop.max_grad_norm)
        else:
            g = peakcut.capture(case.model, case.batch, case.loss_fn, case.optimizer, keep_grads=True)
        where = "search root"
        dims = rng.choice(["batch", "all"])
        found = optimize_graph(g, time_budget=0.3, max_states=1, device=DEVICE, fission_dims=dims)
        deriver, state = found.deriver, found.result.root
        if state.applied:
            out.applied["re-order"] += 1
        settings = MoveSettings(hotspots_only=flip(rng, 0.5))
        for _ in range(moves):
            where = "moves"
            by_kind: dict[str, list] = {}
            for move in children(state, deriver, settings, rng):
                by_kind.setdefault(move.kind, []).append(move)
            if not by_kind:
                break
            kind = rng.choice(sorted(by_kind))
            move = rng.choice(by_kind[kind])
            where = f"applying {kind}: {move.description}"
            try:
                child = move.build()
                if child.pending is not None:
                    child = deriver.resolve(child)
            except DeriveError:
                out.refused[kind] += 1
                if move.rule:
                    out.refused[f"{kind}: {move.rule}"] += 1
                continue
            state = child
            out.applied[kind] += 1
            if move.rule:
                out.applied[f"{kind}: {move.rule}"] += 1
            out.steps.append(move.description)
        where = "full expansion"
        if state.compact:
            state = deriver.exact(state)
        where = "running the program"
        largest = max((t.numel for t in g.tensors.values()), default=1)
        tol = rounding_tolerance(case.dtype, largest, STEPS)
        report: Any
        if case.loop is not None or case.autocast:
            loop = case.as_user_loop()
            if case.autocast:       # bf16 outputs of matmuls and convolutions (bench.fuzz.loop)
                tol = autocast_tolerance(STEPS)
            report = run_user_loop(case.model, case.batch, case.loss_fn, loop,
                                   lambda _m, opt: Step(state.program, state.order, optimizer=opt), STEPS,
                                   tol, seed=case.seed, precise_loss_fn=case.precise_loss_fn)
            out.worst = report.worst
        else:
            report = check_equivalence(case.model, case.batch, case.loss_fn, case.optimizer,
                                       lambda _m: Step(state.program, state.order), steps=STEPS,
                                       rtol=tol, atol=tol, seed=case.seed)
        if not report.ok:
            out.status, out.detail = "mismatch", str(report)
            return out
        where = "measuring the peak"
        simulated = simulate(state.program, state.order).peak_bytes
        measured = peakcut.measure(Step(state.program, state.order), copy.deepcopy(case.model), case.batch,
                                   method="cpu-profiler", repeats=1).peak_bytes
        if abs(simulated - measured) > PEAK_TOLERANCE * measured:
            out.status = "memory"
            out.detail = f"simulated peak {simulated} B, measured {measured} B (tolerance {PEAK_TOLERANCE:.0%})"
    except Exception as e:  # noqa: BLE001 - a crash is an outcome to report, with where it happened
        out.status = "crash"
        out.detail = f"{where}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}"
    out.seconds = time.perf_counter() - t0
    return out
