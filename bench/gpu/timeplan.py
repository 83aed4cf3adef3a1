"""The run's time plan: which workloads and limits fit the deadline, in which order, and how
many seconds each optimize gets.

Workloads run in ORDER (the most informative first: one transformer, one CNN, one LLM, then
the rest), each in one process that runs every limit it was given. A job is one workload
under one limit; jobs are admitted in PRIORITY (every latency limit before any memory
limit, each in ORDER) while the admitted workloads' fixed seconds and MIN_BUDGET_S per
admitted job fit the time left; the rest is split evenly between the admitted jobs as their
optimize time_budget (at most MAX_BUDGET_S). Fixed seconds are estimated from eager's step
time measured on an NVIDIA H200 (STEP_S, CUDA events at paper size): process start-up,
build, the timed steps of eager, of the peers and of each plan, and the simulated figures,
times Effort.slowdown on a slower machine (an H100, or a CPU's dry run).
The plan is made again before each workload from the time actually left, and the process
itself shrinks its budgets to what is left of its slot once eager's step is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ORDER: tuple[str, ...] = ("bert-base", "resnet50", "gpt-neo-1.3b", "vit-base", "unet", "btlm-3b", "unetpp")
LIMITS: dict[str, tuple[str, float]] = {"latency": ("latency_limit", 1.10), "memory": ("memory_limit", 0.5)}
STEP_S: dict[str, float] = {"resnet50": 0.077, "bert-base": 0.280, "vit-base": 0.173, "unet": 0.278,
                            "unetpp": 0.149, "gpt-neo-1.3b": 0.530, "btlm-3b": 1.179}
BUILD_S: dict[str, float] = {"gpt-neo-1.3b": 6.0, "btlm-3b": 12.0}     # build, host copies, number checks
SIMULATE_S: dict[str, float] = {"gpt-neo-1.3b": 15.0, "btlm-3b": 25.0}  # capture and simulate on the profile
STARTUP_S = 5.0         # CUDA context and first kernels (the imports ran while the previous workload did)
DEFAULT_BUILD_S = 3.0
DEFAULT_SIMULATE_S = 6.0
OPTIMIZE_OVERHEAD_S = 5.0   # what one optimize call takes beyond its time_budget, and codegen
SLOWER = 1.3            # a plan's or a peer's step against eager's, for planning
PEERS = 3               # accumulation k = 2 and 4, selective activation checkpointing
MIN_BUDGET_S = 10.0
MAX_BUDGET_S = 90.0
GRACE_S = 15.0          # beyond its slot before a workload's process is stopped


TIMED_S = 4.0           # seconds of timed steps per configuration, at most (by STEP_S)
MAX_RUNS = 10
MIN_RUNS = 3


@dataclass(frozen=True)
class Effort:
    """Timed steps per configuration (each also runs a first step, checked, and a peak step):
    `runs` for eager and the plans, `peer_runs` for each peer; None: TIMED_S worth of steps
    by STEP_S, MIN_RUNS to MAX_RUNS (the peers half as many, at least 2)."""

    runs: int | None = None
    peer_runs: int | None = None
    fixed_budget: float | None = None    # --budget: this time_budget for every optimize
    slowdown: float = 1.0       # --slowdown: the machine's fixed seconds over the H200 estimates

    def timed_steps(self, name: str) -> tuple[int, int]:
        """(runs, peer_runs) for workload `name`."""
        auto = max(MIN_RUNS, min(MAX_RUNS, int(TIMED_S / step_seconds(name))))
        runs = auto if self.runs is None else self.runs
        return runs, max(2, runs // 2) if self.peer_runs is None else self.peer_runs


@dataclass
class Slot:
    """One workload's share of the run: its limits, its optimize budget per limit and the
    seconds it may take in all; `skipped` what of it was left out and why."""

    workload: str
    limits: list[str]
    budget_s: float
    seconds: float
    runs: int
    peer_runs: int
    fixed: bool = False         # budget_s given by the user: no process shrinks it
    slowdown: float = 1.0       # Effort.slowdown
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_seconds(name: str) -> float:
    return STEP_S.get(name, 0.3)


def measuring_seconds(name: str, limits: int, effort: Effort, step_s: float | None = None) -> float:
    """The timed steps of eager, the peers and `limits` plans of workload `name`."""
    s = step_seconds(name) if step_s is None else step_s
    runs, peer_runs = effort.timed_steps(name)
    eager = (2 + runs) * s
    peers = PEERS * (2 + peer_runs) * s * SLOWER
    return eager + peers + limits * plan_measuring_seconds(s, runs)


def plan_measuring_seconds(step_s: float, runs: int) -> float:
    """One plan's steps (checked, peak, `runs` timed) and what optimize takes beyond its budget."""
    return (2 + runs) * step_s * SLOWER + OPTIMIZE_OVERHEAD_S


def fixed_seconds(name: str, limits: int, effort: Effort) -> float:
    """Everything of workload `name` but its optimize budgets (module doc)."""
    return effort.slowdown * (STARTUP_S + BUILD_S.get(name, DEFAULT_BUILD_S) + simulate_seconds(name)
                              + measuring_seconds(name, limits, effort))


def simulate_seconds(name: str) -> float:
    return SIMULATE_S.get(name, DEFAULT_SIMULATE_S)


def plan_run(jobs: Sequence[tuple[str, str]], seconds: float, effort: Effort) -> list[Slot]:
    """Slots for `jobs` ((workload, limit), in any order) within `seconds`, in ORDER; a workload
    with no admitted job is a slot with no limits, seconds 0 and its reason (module doc)."""
    names = sorted({w for w, _ in jobs}, key=lambda w: (ORDER.index(w) if w in ORDER else len(ORDER), w))
    priority = sorted(jobs, key=lambda j: (list(LIMITS).index(j[1]), names.index(j[0])))
    floor = MIN_BUDGET_S if effort.fixed_budget is None else effort.fixed_budget
    admitted: list[tuple[str, str]] = []
    for job in priority:
        trial = admitted + [job]
        if _cost(trial, effort, floor) <= seconds:
            admitted = trial
    spare = seconds - _cost(admitted, effort, 0.0)
    budget = effort.fixed_budget if effort.fixed_budget is not None else (
        min(MAX_BUDGET_S, spare / len(admitted)) if admitted else 0.0)
    slots = []
    for name in names:
        limits = [lim for w, lim in admitted if w == name]
        left_out = [lim for w, lim in jobs if w == name and (w, lim) not in admitted]
        need = fixed_seconds(name, len(limits), effort) + len(limits) * budget if limits else 0.0
        slot = Slot(name, sorted(limits, key=list(LIMITS).index), round(budget, 1), round(need, 1),
                    *effort.timed_steps(name), fixed=effort.fixed_budget is not None, slowdown=effort.slowdown)
        slot.skipped = [f"{lim} limit: not run, would not fit the {seconds:.0f} s left "
                        f"({_cost(admitted + [(name, lim)], effort, floor):.0f} s estimated with it)"
                        for lim in left_out]
        slots.append(slot)
    return slots


def _cost(jobs: Sequence[tuple[str, str]], effort: Effort, budget: float) -> float:
    counts: dict[str, int] = {}
    for w, _ in jobs:
        counts[w] = counts.get(w, 0) + 1
    return sum(fixed_seconds(w, k, effort) + k * budget for w, k in counts.items())


def child_budget(planned: float, seconds_left: float, limits_left: int, measuring_left: float) -> float:
    """One optimize's time_budget inside a workload's process: the planned one, or less where
    the slot's `seconds_left` less the measuring still to do (`measuring_left`) does not hold
    `limits_left` of them; 0 where less than MIN_BUDGET_S would remain (the limit is skipped)."""
    fits = (seconds_left - measuring_left) / max(1, limits_left)
    budget = min(planned, fits)
    return budget if budget >= min(MIN_BUDGET_S, planned) else 0.0
