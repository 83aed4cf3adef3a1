"""peakcut.optimize(): capture a step, search, and return a runnable Plan.

    plan = peakcut.optimize(model, batch, loss_fn=loss, optimizer="adamw",
                            memory_limit=0.4, time_budget=60, device="h200")
    loss = plan.step(batch)

optimize_graph() is the same search on an already captured graph (paper-size models
on the meta device, the CLI, the benchmarks); it returns the search result and the
report without building a program. The report: optimizer.report; the sentences of a
LimitNotMet: optimizer.limit_messages; the verification: optimizer.verification; how the
time budget is shared: optimizer.shares, and where it went: report["phases"]
(optimizer.phases).
"""

from __future__ import annotations

import gc
import math
import operator
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from peakcut.capture import capture
from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.cost import get_cost_model
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.protocol import CostModel
from peakcut.fission.analyzer import DEFAULT_LEVELS
from peakcut.fission.build import find_ftree, random_ftree
from peakcut.fission.ftree import FTree
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.memory.workspace import WorkspaceSpec, workspace_model
from peakcut.optimizer import arena as arenas
from peakcut.optimizer import shares
from peakcut.optimizer.arena import arena_choice, arena_margin, layout_seconds
from peakcut.optimizer.budget import BudgetedCost, MeasurePacer
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.context import calibrate
from peakcut.optimizer.data_parallel import check_same_program, check_same_step, rank_zero_program
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.held_floor import HOST_DEVICES, held_floor_refusal
from peakcut.optimizer.limit_messages import search_shortfall, whole_op
from peakcut.optimizer.numbers import check_seconds
from peakcut.optimizer.objective import Objective, parse_latency_limit, parse_memory_limit
from peakcut.optimizer.optimized import Optimized
from peakcut.optimizer.parallel import isolated, parallel_search
from peakcut.optimizer.phases import merged, phases_entry
from peakcut.optimizer.plan import LimitNotMet, Plan, Program
from peakcut.optimizer.polish import polished
from peakcut.optimizer.report import (
    note_shortfall,
    search_report,
    step_entry,
    step_floors_for,
    zero_offload_peer,
)
from peakcut.optimizer.reprice import rebest, reprice
from peakcut.optimizer.root_rewrites import with_root_rewrites
from peakcut.optimizer.search import Progress
from peakcut.optimizer.state import State, computation_hash
from peakcut.optimizer.verification import host_memory, verified, verify_seconds
from peakcut.optimizer.verify import MIN_ROUNDS, EagerStep, model_device
from peakcut.optimizer.verify import runs_here as verify_runs_here
from peakcut.rules import REWRITE_MOVES, RULES, Registry
from peakcut.runtime.host_allocator import release_freed_host_memory
from peakcut.schedule import schedule
from peakcut.simulate import Timeline, simulate_timeline
from peakcut.spec.data_parallel import DataParallelSpec, describe_data_parallel, is_data_parallel
from peakcut.spec.fully_sharded import FullyShardedSpec, describe_fully_sharded, is_fully_sharded
from peakcut.spec.optimizers import resolve_optimizer


def _budgeted(cost: CostModel, deadline: float) -> CostModel:
    """The cost model; a measured one prices calls not measured yet by fitted prices and
    measures them between expansions until the deadline (BudgetedCost)."""
    return BudgetedCost(cost, deadline) if isinstance(cost, MeasuredCostModel) else cost


def _on_host(settings: MoveSettings | None, cost: CostModel, rules: Registry = RULES) -> MoveSettings | None:
    """Without the rules that free memory by host copies when the device is the host (a CPU
    cost model): there a copy to host memory frees nothing."""
    if cost.name not in HOST_DEVICES:
        return settings
    kinds = [k for k in rules.move_kinds if settings is None or settings.uses(k)]
    kept = frozenset(k for k in kinds if k not in rules.program_kinds
                     or not rules.program_rule(k).frees_by_host_copy)
    return replace(settings or MoveSettings(), kinds=kept)


def _check_arguments(memory_limit: Any, latency_limit: Any, fission_dims: Any, time_budget: Any, jobs: Any,
                     seed: Any, max_states: Any) -> None:
    """Refuse, by name, the search arguments that are not what they must be (the limits'
    values are checked by peakcut.optimizer.objective)."""
    def whole(x: Any) -> bool:
        if isinstance(x, bool):
            return False
        try:
            operator.index(x)          # int, numpy integers
        except TypeError:
            return False
        return True

    if memory_limit is not None and latency_limit is not None:
        raise ValueError("give memory_limit or latency_limit, not both (the other is minimized)")
    if fission_dims not in ("batch", "all"):
        raise ValueError(f"fission_dims={fission_dims!r}: expected 'batch' or 'all'")
    if (not isinstance(time_budget, (int, float)) or isinstance(time_budget, bool) or time_budget < 0
            or math.isnan(time_budget)):
        raise ValueError(f"time_budget={time_budget!r}: expected seconds >= 0 (inf: no bound but max_states)")
    if not whole(jobs) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}: expected a number of processes >= 1")
    if not whole(seed):
        raise ValueError(f"seed={seed!r}: expected an integer")
    if max_states is not None and (not whole(max_states) or max_states < 1):
        raise ValueError(f"max_states={max_states!r}: expected None or a number of states >= 1")


def optimize_graph(g: Graph, *, memory_limit: float | int | str | None = None,
                   latency_limit: float | str | None = None, time_budget: float = 60.0,
                   device: str | CostModel = "h200", seed: int = 0, max_states: int | None = None,
                   pareto: bool = False, settings: MoveSettings | None = None,
                   fission_dims: str = "batch", reorder: bool = True, workspace: WorkspaceSpec = "auto",
                   levels: int = DEFAULT_LEVELS, naive_fission_seed: int | None = None,
                   progress: Callable[[Progress], None] | None = None, jobs: int = 1,
                   eager_ratio: float = 1.0, plan_margin: float = 0.0, arena: bool | None = False,
                   rules: Registry = RULES, isolate: bool = False, host_keeps_freed: bool = False) -> Optimized:
    """Search the rules on captured graph `g` under one limit (see peakcut.optimize).

    levels: L of Algorithm 1. naive_fission_seed: replace the F-Tree by random valid
    regions (the "naive fission" ablation of MAGIS §7.2.5). eager_ratio: the user's eager
    step's time as a multiple of the captured step's, when measured
    (peakcut.optimizer.context); a latency limit is a ratio to the user's eager step.
    plan_margin: under a latency limit, the share of it the search keeps free (it plans to
    limit x (1 - plan_margin)); the limit judged, reported and verified is the user's.
    arena: the plan runs with its arena; a memory limit bounds held + arena + unplanned bytes
    (peakcut.optimizer.arena: arena_margin, arena_choice; report["arena"]); None: where
    arena_by_default says so (a step on a CPU with enough transient bytes).
    rules: the registry the search applies (peakcut.rules: RULES, or WITH_FUSED).
    isolate: with jobs = 1, run the search in a forked process where that is possible
    (peakcut.optimizer.parallel: isolated), so this process does not keep the memory it used.
    host_keeps_freed: on a CPU, the plan runs where glibc keeps freed memory
    (peakcut.runtime.keep_freed_host_memory, as optimize sets up to measure); the report's
    predicted_reserved_bytes models that allocator, else glibc's defaults (optimizer.arena).
    """
    t0 = time.perf_counter()
    _check_arguments(memory_limit, latency_limit, fission_dims, time_budget, jobs, seed, max_states)
    if not isinstance(rules, Registry):
        raise ValueError(f"rules={rules!r}: expected a peakcut.rules.Registry (RULES, WITH_FUSED)")
    named = get_cost_model(device) if isinstance(device, str) else device
    workspace = workspace_model(workspace, g.device)     # "auto": the GPU's own for a graph on a GPU
    unreachable = None if pareto else held_floor_refusal(g, memory_limit, named.name, workspace)
    if unreachable is not None:                 # no search: nothing it finds can meet the limit
        time_budget, reorder = 0.0, False
    cost = _budgeted(named, t0 + time_budget)
    if jobs > 1 and isinstance(cost, BudgetedCost):
        raise ValueError(f"jobs={jobs} with device {cost.name!r}: a measured cost model measures op "
                         "latencies during the search, which parallel searches would disturb; use jobs=1")
    settings = _on_host(settings, cost, rules)
    eager = simulate_timeline(g, g.order, cost, workspace)
    arena = arenas.arena_by_default(g, eager) if arena is None else arena
    floors = step_floors_for(g, cost, workspace)
    peer = zero_offload_peer(g, cost, workspace, floors)    # (before the search: inside its budget)
    objective, planned = _objectives(eager, memory_limit, latency_limit, pareto, eager_ratio, plan_margin)
    deriver = Deriver(cost, workspace, levels=levels, batch_only=fission_dims == "batch", rules=rules)
    root, tree = _root(g, deriver, planned, reorder and time_budget > 0, time_budget, naive_fission_seed)
    untransformed = root
    probes: dict[Any, str | None] = {}       # the out overloads' probe verdicts, shared by the arena's checks
    if arena:
        planned = arena_margin(planned, root, workspace, layout_seconds(time_budget), probes)
    if time_budget > 0:
        root = with_root_rewrites(root, deriver, settings, None if pareto else planned)   # the front's fast end stays
    budgeted = isinstance(cost, BudgetedCost) and time_budget > 0
    kept = shares.REPRICE_SHARE * time_budget if budgeted and math.isfinite(time_budget) else 0.0  # for reprice
    kept += layout_seconds(time_budget) if math.isfinite(time_budget) else 0.0     # the report's arena layout
    left = max(0.0, time_budget - kept - (time.perf_counter() - t0))
    polishing = time_budget > 0 and not pareto and (settings is None or settings.uses(REWRITE_MOVES))
    searching = left * (1 - shares.POLISH_SHARE) if polishing else left
    pacer = (MeasurePacer(cost, until=time.perf_counter() + searching)
             if budgeted and isinstance(cost, BudgetedCost) else None)
    result = parallel_search(root, deriver, planned, jobs=jobs, seed=seed, max_states=max_states,
                             time_budget=searching, settings=settings, progress=progress, pacer=pacer,
                             exact_front=pareto, isolate=isolate and isolated(measures=isinstance(cost, MeasuredCostModel)))
    polish_s = time.perf_counter()
    if polishing:
        result = polished(result, deriver, planned, deadline=t0 + time_budget - kept)
    polish_s = time.perf_counter() - polish_s
    searched_s = time.perf_counter() - t0
    repriced = None
    if budgeted and isinstance(cost, BudgetedCost):
        extra = () if root is untransformed else (untransformed,)
        eager, repriced = reprice(cost, g, result, workspace, t0 + time_budget, extra)
        objective, planned = _objectives(eager, memory_limit, latency_limit, pareto, eager_ratio, plan_margin)
        if arena:
            planned = arena_margin(planned, untransformed, workspace, layout_seconds(time_budget), probes)
        result = rebest(result, planned)
    chosen = None
    if arena:
        result, chosen = arena_choice(result, objective, deriver, (root, untransformed), layout_seconds(time_budget),
                                      probes)
    report = search_report(g, cost, workspace, objective, planned, eager, eager_ratio, floors, peer, tree.summary(),
                           result, plan_margin=plan_margin, polish_s=polish_s, time_budget=time_budget, seed=seed,
                           t0=t0, host_keeps_freed=host_keeps_freed)
    seconds = {"search": searched_s}
    if repriced is not None:
        report["repriced"] = dict(repriced, **cost.as_dict()) if isinstance(cost, BudgetedCost) else repriced
        seconds["reprice"] = repriced["seconds"]
    report["phases"] = phases_entry(seconds, {"search": result.states}, time_budget, time.perf_counter() - t0,
                                    pacer.spent if pacer is not None else 0.0)
    if chosen is not None:
        report["arena"] = chosen.as_dict()
        report["feasible"] = objective.feasible(chosen.needed_bytes, result.best.latency_s)
    note_shortfall(report, g, objective, result.best, unreachable, cost, deriver.workspace, named.name, workspace,
                   None if root is untransformed else root)
    return Optimized(result, objective, report, cost, eager, deriver, eager_ratio,
                     None if root is untransformed else untransformed, chosen, probes)


def _objectives(eager: Timeline, memory_limit: float | int | str | None, latency_limit: float | str | None,
                pareto: bool, eager_ratio: float, plan_margin: float) -> tuple[Objective, Objective]:
    """The user's objective (a memory or a latency limit; the default latency limit; the
    front) and the one the search plans to: under a latency limit, the limit less
    `plan_margin` of it."""
    if pareto:
        objective = Objective("latency", math.inf)
    elif memory_limit is not None:
        objective = Objective("memory", parse_memory_limit(memory_limit, eager.peak_bytes))
    else:
        ratio = shares.DEFAULT_LATENCY_LIMIT if latency_limit is None else latency_limit
        objective = Objective("latency", parse_latency_limit(ratio, eager_ratio * eager.latency_seconds))

    planned = objective          # what the search plans to: the limit less the margin
    if plan_margin > 0 and objective.mode == "latency" and math.isfinite(objective.limit):
        planned = Objective("latency", objective.limit * (1 - plan_margin))
    return objective, planned


def _root(g: Graph, deriver: Deriver, planned: Objective, reorder: bool, time_budget: float,
          naive_fission_seed: int | None) -> tuple[State, FTree]:
    """The search's root: the step with its loss detached, in a memory-aware order where
    `reorder` and `planned` prefers it to capture order, its F-Tree found (Algorithm 1, or
    random regions for the naive-fission ablation); and that F-Tree."""
    base = detach_loss(g) if g.signature.mode != "inference" else g.copy()
    order = list(base.order)
    if reorder:
        found = schedule(base, time_limit=max(0.05, shares.REORDER_SHARE * time_budget), workspace=deriver.workspace)
        order = list(found.order)
    if naive_fission_seed is None:
        tree, dgraph = find_ftree(base, order, deriver.levels, batch_only=deriver.batch_only,
                                  workspace=deriver.workspace)
    else:
        tree, dgraph = random_ftree(base, order, naive_fission_seed, batch_only=deriver.batch_only)
    base_digest = computation_hash(base)
    root = deriver.finish(base, order, tree, dgraph, (), base, order, (), 0, base_digest=base_digest, rewrites=())
    if order != list(base.order):
        captured = deriver.finish(base, list(base.order), tree, dgraph, (), base, list(base.order), (), 0,
                                  base_digest=base_digest, rewrites=())
        if planned.better(planned.key(captured.peak_bytes, captured.latency_s),
                          planned.key(root.peak_bytes, root.latency_s)):
            root = captured
        else:
            root.applied = ("re-order (memory-aware schedule)",)
    return root, tree


def optimize(model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any] | None = None,
             optimizer: Any = "adamw", *, memory_limit: float | int | str | None = None,
             latency_limit: float | str | None = None, time_budget: float = 60.0,
             device: str | CostModel = "h200", seed: int = 0, max_states: int | None = None,
             pareto: bool = False, settings: MoveSettings | None = None, fission_dims: str = "batch",
             keep_grads: bool = False, progress: Callable[[Progress], None] | None = None,
             jobs: int = 1, max_grad_norm: float | None = None, scaler: Any = None, accumulate: int = 1,
             replan: bool = True, verify: bool = True, keep_host_memory: bool = True, arena: bool | None = None,
             rules: Registry = RULES) -> Plan:
    """Optimize one training step of `model` on `batch` and return a runnable Plan.

    - loss_fn(model, batch) -> scalar loss; None optimizes inference of model(*batch).
    - optimizer: your torch.optim.SGD / Adam / AdamW (any param groups; plan.step reads its
      param_groups at every step and keeps its state in it, so LR schedulers, checkpoints
      and hand edits work as in your eager loop), "adamw" / "adam" / "sgd", a peakcut recipe,
      or None (plan.step then adds the gradients to p.grad, like loss.backward()).
    - max_grad_norm: clip by global norm before the update (torch.nn.utils.clip_grad_norm_ over
      the optimizer's parameters). scaler: a torch.amp.GradScaler (fp16 training): the loss is
      scaled, the update skipped on inf/nan, and the scaler's scale updated, as scaler.step /
      scaler.update do. accumulate=k: plan.step is called once per micro-batch and updates on
      every k-th call, like an eager loop that calls backward() k times before optimizer.step().
    - memory_limit: 0.4 (fraction of the eager peak), "40%", "12GB" or bytes: the least
      latency under it. latency_limit: 1.1 (ratio to eager): the least memory under it.
      Neither: latency_limit 1.1. pareto=True: the memory/latency front is in the report.
    - device: a cost model ("h200", "rtx3090", "a100-80gb", "h100", "cpu", "measured").
    - time_budget (seconds) bounds the whole call; max_states bounds the states built; the
      same seed gives the same plan when the search ends before the clock does.
    - replan: a batch of another shape (a short last batch) is planned again on first sight
      (a warning says how long it took) and cached; False raises StepBindingError instead.
    - keep_grads: the step also returns the gradients (for checking against eager).
    - jobs: processes to search on (forked; analytic cost models only; see
      peakcut.optimizer.parallel).
    - verify: when the plan runs on the device it is planned for (device="measured" on the
      model's device), the last VERIFY_SHARE of the time budget (at least what running eager
      and one plan MIN_ROUNDS rounds takes, when the budget has it) runs the best few candidate
      plans for real, interleaved with your eager step, and keeps the best one whose measured
      time and peak meet the limit (peakcut.optimizer.verify; report["verification"]).
      Before the search it runs the untransformed step and your eager step a few times to
      calibrate the per-op times to a whole step and to your loop (peakcut.optimizer.context;
      report["context"]).
    - keep_host_memory: with verify on a CPU model, first make glibc's malloc keep freed
      memory (peakcut.runtime.host_allocator: no page faults for activations made again
      every step; the process's resident size stays at its high-water mark). The measured
      per-op times assume it; False leaves the allocator alone.
    - model may be a DistributedDataParallel module: call optimize on every rank with that
      rank's batch (same shapes everywhere); the step broadcasts rank 0's buffers and
      all-reduces the gradients in DDP's buckets as graph nodes the search schedules, rank 0
      searches (analytic cost models only) and every rank runs its plan (docs/distributed.md).
    - arena=True: the plan places each result it can in one arena, made once and kept across
      steps (peakcut.codegen.arena_plan; report["arena"]: its bytes and the unplanned
      remainder, each storage with its bytes and why); a memory limit then bounds the
      caller's storages + the arena + the unplanned remainder's peak, and verification runs
      the candidates with their arenas. None (the default): on for a single-process step on a
      CPU with at least 64 MiB of transient bytes, whose heap otherwise splits around them
      (peakcut.optimizer.arena.arena_by_default, docs/memory_layout.md), off elsewhere and with
      accumulate > 1.
    - rules: the registry of rules the search applies: peakcut.rules.RULES (the default), or
      peakcut.rules.WITH_FUSED (RULES and fused attention, docs/taso.md).
    Raises LimitNotMet (with `.plan`, the best plan found) when the limit is not met.
    """
    _check_arguments(memory_limit, latency_limit, fission_dims, time_budget, jobs, seed, max_states)
    if optimizer is not None and loss_fn is None:
        raise ValueError("an optimizer needs loss_fn(model, batch) -> scalar loss")
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise ValueError(f"accumulate={accumulate!r}: expected a number of micro-batches >= 1")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler: expected a torch.amp.GradScaler, got {type(scaler).__name__}")
    use_scaler = scaler is not None and scaler.is_enabled()
    model, data_parallel = _unwrapped(model, device)
    arena = arenas.arena_setting(arena, data_parallel is not None, accumulate)
    opt = resolve_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    if accumulate > 1 and opt is None:
        raise ValueError("accumulate=k needs an optimizer; without one plan.step already adds into p.grad")
    search = dict(memory_limit=memory_limit, latency_limit=latency_limit, device=device, seed=seed,
                  max_states=max_states, pareto=pareto, settings=settings, fission_dims=fission_dims,
                  progress=progress, jobs=jobs, isolate=True, **({"arena": arena} if arena is not False else {}),
                  **({"rules": rules} if rules is not RULES else {}))
    checked = (verify and not pareto and not use_scaler and accumulate == 1 and data_parallel is None
               and (not isinstance(device, str) or device.startswith("measured"))
               and verify_runs_here(get_cost_model(device) if isinstance(device, str) else device, model))
    plan_for = _Planner(model, loss_fn, opt, device, memory_limit, search, checked, keep_grads, max_grad_norm,
                        use_scaler, accumulate, keep_host_memory, data_parallel)
    main, micro = plan_for(batch, time_budget)
    plan = Plan(model, main.graph, main.order, main.report, optimizer=opt, scaler=scaler, micro=micro, placed=main.arena,
                accumulate=accumulate, replan=(lambda b: plan_for(b, time_budget)) if replan else None,
                batch=batch, arena=arena is True)
    if model_device(model).type == "cpu":
        gc.collect()
        release_freed_host_memory()     # what the search freed leaves the process (runtime.host_allocator)
    for program in (main, micro):
        if program is not None and not program.feasible and not pareto:
            raise LimitNotMet(program.why_not, plan, program.report.get("verification"))
    return plan


@dataclass(frozen=True)
class _Planner:
    """What optimize plans a step with: the user's objects and options. Called with a batch and
    a time budget: the step captured on it, searched (with calibration and verification where
    `checked`), and, with accumulation, the micro-batch step too."""

    model: torch.nn.Module
    loss_fn: Callable[..., Any] | None
    opt: torch.optim.Optimizer | None
    device: str | CostModel
    memory_limit: float | int | str | None
    search: dict[str, Any]          # optimize_graph's arguments
    checked: bool                   # calibrate and verify on this machine
    keep_grads: bool
    max_grad_norm: float | None
    use_scaler: bool
    accumulate: int
    keep_host_memory: bool
    data_parallel: DataParallelSpec | FullyShardedSpec | None = None     # DDP's or FSDP2's ranks

    def __call__(self, b: Any, budget: float) -> tuple[Program, Program | None]:
        t0 = time.perf_counter()
        model, loss_fn, opt = self.model, self.loss_fn, self.opt
        final_share = budget if self.accumulate == 1 else budget * 0.6
        g = capture(model, b, loss_fn, opt, keep_grads=self.keep_grads, max_grad_norm=self.max_grad_norm,
                    grad_scaler=self.use_scaler, accumulate=self.accumulate > 1,
                    data_parallel=self.data_parallel if isinstance(self.data_parallel, DataParallelSpec) else None,
                    fully_sharded=self.data_parallel if isinstance(self.data_parallel, FullyShardedSpec) else None)
        if self.data_parallel is not None:      # the same plan on every rank: rank 0's
            dp, left = self.data_parallel, budget - (time.perf_counter() - t0)
            check_same_step(g, {k: v for k, v in self.search.items() if k != "progress"}, dp, "captured step")
            main = rank_zero_program(lambda: _search(g, left, model, self.search, self.accumulate), dp)
            check_same_program(main, dp)
            return main, None
        check = None
        searched = self.search
        calibration = None
        kept = False                    # whether glibc keeps freed memory for this plan (host_memory)
        cost = get_cost_model(self.device) if isinstance(self.device, str) else self.device
        captured_s = time.perf_counter() - t0
        if self.checked and loss_fn is not None and held_floor_refusal(g, self.memory_limit, cost.name) is None:
            eager = EagerStep(model, b, loss_fn, opt, self.max_grad_norm)
            fingerprint_s = 0.0                  # the numbers check's fingerprints of one run
            if isinstance(cost, MeasuredCostModel):    # (plans run, and are checked, only here)
                fingerprint_s = check_seconds(g)
                allocator, kept = host_memory(model, self.keep_host_memory)
                calibration = calibrate(g, cost, model, b, eager, opt, shares.CALIBRATE_SHARE * budget,
                                        measure_seconds=shares.MEASURE_BEFORE_SHARE * budget)
                if calibration.skipped and not calibration.deferred:
                    warnings.warn(f"peakcut: per-op times not calibrated to a whole step: {calibration.skipped}",
                                  stacklevel=3)
                searched = dict(self.search, device=cost, eager_ratio=calibration.eager_ratio,
                                plan_margin=shares.PLAN_MARGIN, host_keeps_freed=kept)

            def check(found: Optimized, seconds: float) -> tuple[State, bool, str, ArenaPlan | None]:
                return verified(found, seconds, model, b, eager, opt, calibration, fingerprint_s, kept)
        keep = shares.VERIFY_SHARE * final_share
        if calibration is not None and calibration.eager_step_s > 0:    # sized on the calibration's step
            # eager and one plan; under a latency limit the untransformed step is the reserve,
            # checked and timed only where the plans miss the limit; the numbers check
            # fingerprints every program's updates once (optimizer.numbers)
            referenced = calibration.reference is not None      # eager's numbers taken already
            least = verify_seconds(calibration.eager_step_s, fingerprint_s, referenced=referenced)
            wanted = max(keep, shares.VERIFY_MARGIN * verify_seconds(calibration.eager_step_s, fingerprint_s,
                                                                     MIN_ROUNDS, referenced))
            # the search's share first (optimize_graph keeps its reprice's and its layout's
            # seconds after the search), unless verifying one plan needs more
            searching = graph_budget(shares.SEARCH_SHARE * final_share)
            left = final_share - (time.perf_counter() - t0)
            # where no verification fits (it is skipped, and says so): all to the search (what
            # VERIFY_SKIP_BELOW lets verification run on is for the search's overrun, not a
            # reason to search nothing)
            keep = max(least, min(wanted, left - searching)) if least <= left else 0.0
        main = _search(g, final_share - (time.perf_counter() - t0), model, searched, self.accumulate, check,
                       keep=keep)
        if calibration is not None:
            main.report["context"] = dict(calibration.as_dict(), host_allocator=allocator)
        main.report["phases"] = merged(main.report.get("phases"), {
            "capture": captured_s, **({"calibration": calibration.seconds} if calibration is not None else {}),
            **({"verification": main.report["verification"].get("seconds", 0.0)}
               if "verification" in main.report else {})},
            {"verification": len(main.report.get("verification", {}).get("candidates", []))}
            if "verification" in main.report else {}, budget, time.perf_counter() - t0)
        micro = None
        if self.accumulate > 1:
            gm = capture(model, b, loss_fn, None, grad_scaler=self.use_scaler)
            micro = _search(gm, budget - (time.perf_counter() - t0), model, self.search, self.accumulate)
        return main, micro


def graph_budget(search_s: float) -> float:
    """The time budget of a measured optimize_graph whose search gets `search_s` seconds: it
    keeps REPRICE_SHARE of its budget and the layout's seconds (arena.layout_seconds) after
    the search."""
    spare = 1 - shares.REPRICE_SHARE
    shared = search_s / (spare - shares.LAYOUT_SHARE)      # the layout at its share
    return shared if shares.LAYOUT_SHARE * shared <= arenas.LAYOUT_MAX_S else (search_s + arenas.LAYOUT_MAX_S) / spare


def _unwrapped(model: torch.nn.Module, device: str | CostModel
               ) -> tuple[torch.nn.Module, DataParallelSpec | FullyShardedSpec | None]:
    """The module to capture, and the spec of its DistributedDataParallel or FSDP2 step if it
    is one."""
    ddp, fsdp = is_data_parallel(model), is_fully_sharded(model)
    if not (ddp or fsdp):
        return model, None
    if isinstance(device, str) and device.startswith("measured") or isinstance(device, MeasuredCostModel):
        raise ValueError(f"device={device!r} with {'DistributedDataParallel' if ddp else 'FSDP2'}: a measured cost "
                         "model times the step's calls on one rank, which collectives cannot run alone; use an "
                         "analytic profile (device='h100', 'h200', 'cpu', ...)")
    return describe_data_parallel(model) if ddp else (model, describe_fully_sharded(model))


def _search(g: Graph, budget: float, model: torch.nn.Module, search: dict[str, Any], accumulate: int,
            check: Callable[[Optimized, float], tuple[State, bool, str, ArenaPlan | None]] | None = None,
            keep: float | None = None) -> Program:
    """optimize_graph on one captured step -> its Program (best graph, order, report); with
    `check`, the search leaves `keep` seconds (default VERIFY_SHARE of the budget) and
    check(found, seconds left) picks the plan that meets the limit when run."""
    t0 = time.perf_counter()
    budget = max(0.0, budget)       # what capture and calibration left of the user's time budget
    keep = 0.0 if check is None else min(keep, budget) if keep is not None else shares.VERIFY_SHARE * budget
    found = optimize_graph(g, time_budget=max(0.0, budget - keep), **search)
    found.report["title"] = f"peakcut plan for {type(model).__name__}"
    found.report["step"] = step_entry(g, accumulate)
    why = "" if found.feasible else search_shortfall(found, budget)
    best, feasible, placed = found.best, found.feasible, found.arena
    if check is not None and not found.report.get("unreachable"):
        best, feasible, measured_why, placed = check(found, budget - (time.perf_counter() - t0))
        why = "" if feasible else (measured_why + whole_op(found.report) if measured_why else why)
    return Program(best.program, list(best.order), found.report, feasible, why, placed)
