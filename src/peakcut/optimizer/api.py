"""peakcut.optimize(): capture a step, search, and return a runnable Plan.

    plan = peakcut.optimize(model, batch, loss_fn=loss, optimizer="adamw",
                            memory_limit=0.4, time_budget=60, device="h200")
    loss = plan.step(batch)

optimize_graph() is the same search on an already captured graph (paper-size models
on the meta device, the CLI, the benchmarks); it returns the search result and the
report without building a program.
"""

from __future__ import annotations

import math
import operator
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from peakcut.capture import capture
from peakcut.capture.optimizers import OptimizerSpec, resolve_optimizer
from peakcut.cost import get_cost_model
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.profiles import DeviceProfile
from peakcut.cost.protocol import CostModel
from peakcut.fission.analyzer import DEFAULT_LEVELS
from peakcut.fission.build import find_ftree, random_ftree
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.memory.workspace import WorkspaceSpec, describe_workspace, workspace_model
from peakcut.optimizer.budget import BudgetedCost
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.context import ContextCalibration, calibrate, refit
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.held_floor import HOST_DEVICES, held_floor_refusal, whole_op_floor
from peakcut.optimizer.objective import Objective, parse_latency_limit, parse_memory_limit
from peakcut.optimizer.parallel import parallel_search
from peakcut.optimizer.plan import LimitNotMet, Plan, Program
from peakcut.optimizer.polish import POLISH_SHARE, polished
from peakcut.optimizer.root_rewrites import with_root_rewrites
from peakcut.optimizer.search import Progress, SearchResult
from peakcut.optimizer.state import State, computation_hash
from peakcut.optimizer.verify import (
    EagerStep,
    candidate_name,
    choose,
    model_device,
    needed_seconds,
    programs_for,
)
from peakcut.optimizer.verify import runs_here as verify_runs_here
from peakcut.report.baselines import zero_offload
from peakcut.report.floors import Floors, step_floors
from peakcut.report.peak_standing import peak_standing
from peakcut.rules import REWRITE_MOVES, RULES
from peakcut.runtime.host_allocator import keep_freed_host_memory
from peakcut.schedule import schedule
from peakcut.simulate import Timeline, simulate_timeline
from peakcut.units import format_bytes, format_seconds

DEFAULT_LATENCY_LIMIT = 1.10      # MAGIS's default: least memory within 10% of eager latency
REORDER_SHARE = 0.1               # share of the time budget the initial re-ordering may take
MEASURE_SHARE = 0.8               # a measured cost model measures new calls until this share
VERIFY_SHARE = 0.25               # of the time budget kept for running candidate plans (verify=True)
CALIBRATE_SHARE = 0.45            # of the time budget the calibration may take, measuring the calls included (verify=True; docs/cost.md)
PLAN_MARGIN = 0.02                # of a latency limit the search keeps free where verification follows: its
# plans predicted at the limit measured either side of it by the run's noise (medium ResNet-50
# x1.098 kept, U-Net x1.103 dropped for the untransformed step, 2026-11-28), which kept nothing
VERIFY_CANDIDATES = 3             # transformed candidates run for real (the untransformed step besides)
VERIFY_MARGIN = 1.15              # verification keeps at least this x what eager and one plan take (verify.needed_seconds)


@dataclass
class Optimized:
    """What optimize_graph found: the search result, the eager figures and the report."""

    result: SearchResult
    objective: Objective
    report: dict[str, Any]
    cost: CostModel
    eager: Timeline          # the captured step in capture order, under `cost`
    deriver: Deriver | None = None
    eager_ratio: float = 1.0  # the user's eager step's time / the captured step's (measured)
    untransformed: State | None = None   # the captured step, where the search's root was rewritten

    @property
    def captured(self) -> State:
        """The untransformed step (in its memory-aware order): the plan of last resort and the
        floor verification measures. The search's root, unless root rewrites made that."""
        return self.result.root if self.untransformed is None else self.untransformed

    @property
    def reference_s(self) -> float:
        """The seconds a latency limit is a ratio of: the user's eager step, predicted."""
        return self.eager_ratio * self.eager.latency_seconds

    def candidates(self, k: int) -> list[State]:
        """Plans worth running for real: the best, then the latest bests the limit admits as
        predicted, newest first, on their full expansion (k in all), then the root (the
        captured step, untransformed, in its memory-aware order): the plan of last resort.
        Under a latency limit the root is always run: it is eager's computation, so when run
        it takes about eager's time, even when a calibration that measured eager faster put
        the limit below its predicted time; under a memory limit only when the limit admits
        its predicted peak."""
        def ident(s: State) -> tuple[str, tuple[int, ...]]:
            return computation_hash(s.program), tuple(s.order)

        root = self.captured
        with_root = self.best is not root and (self.objective.mode == "latency"
                                               or self.objective.feasible(root.peak_bytes, root.latency_s))
        found: list[State] = [self.best]
        seen = {ident(self.best), ident(root)}
        for s in reversed(self.result.bests):
            if len(found) >= k:
                break
            if s is root or not self.objective.feasible(s.peak_bytes, s.latency_s):
                continue
            try:
                exact = self.deriver.exact(s) if self.deriver is not None else s
            except DeriveError:      # its recipes fail on the full expansion: not a candidate
                continue
            if ident(exact) not in seen:
                seen.add(ident(exact))
                found.append(exact)
        if with_root:
            found.append(root)
        return found

    @property
    def best(self) -> State:
        return self.result.best

    @property
    def feasible(self) -> bool:
        return self.objective.feasible(self.best.peak_bytes, self.best.latency_s)


def _budgeted(cost: CostModel, deadline: float) -> CostModel:
    """The cost model; a measured one stops measuring at the deadline (BudgetedCost)."""
    return BudgetedCost(cost, deadline) if isinstance(cost, MeasuredCostModel) else cost


def _estimate(best: State) -> dict[str, float] | None:
    """The search's compact-expansion figures of the best, when it was re-derived in full."""
    found = best.compact_estimate
    return None if found is None else {"peak_bytes": found[0], "latency_s": found[1]}


def _methods(cost: CostModel, workspace: WorkspaceSpec) -> tuple[str, str]:
    memory = f"simulated: peakcut timeline (compute + copy streams), {describe_workspace(workspace)}"
    name = cost.name
    if name.startswith("measured"):
        latency = f"simulated from per-op times measured on this machine ({name}), on the peakcut timeline"
        measured = cost.measured if isinstance(cost, BudgetedCost) else cost
        if isinstance(measured, MeasuredCostModel) and measured.context != 1.0:
            latency += (f", each call x{measured.context:.3f} for running inside the whole step "
                        "(the untransformed step measured here; report['context'])")
        if isinstance(cost, BudgetedCost) and cost.estimated:
            latency += (f"; {len(cost.estimated)} calls seen after the time budget ran out are "
                        "analytic estimates")
    else:
        latency = f"simulated: {name} device profile on the peakcut timeline"
    return memory, latency


def _on_host(settings: MoveSettings | None, cost: CostModel) -> MoveSettings | None:
    """Without the rules that free memory by host copies when the device is the host (a CPU
    cost model): there a copy to host memory frees nothing."""
    if cost.name not in HOST_DEVICES:
        return settings
    kinds = [k for k in RULES.move_kinds if settings is None or settings.uses(k)]
    kept = frozenset(k for k in kinds if k not in RULES.program_kinds
                     or not RULES.program_rule(k).frees_by_host_copy)
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


def _floors(g: Graph, cost: CostModel, workspace: WorkspaceSpec) -> Floors | None:
    """The step's physical floors on an analytic device profile (report.floors); None for a
    measured cost model, which has no peak figures to price them with."""
    profile = getattr(cost, "profile", None)
    if not isinstance(profile, DeviceProfile):
        return None
    return step_floors(g, profile, workspace=workspace, tf32=bool(getattr(cost, "tf32", False)))


def _zero_offload(g: Graph, cost: CostModel, workspace: WorkspaceSpec, floors: Floors | None) -> dict[str, Any] | None:
    """The ZeRO-Offload-style peer on the same yardstick (report.baselines), where a host link
    is priced: an analytic GPU profile whose copies overlap compute (None elsewhere)."""
    if floors is None or not cost.overlap_copies or g.signature.mode == "inference":
        return None
    return zero_offload(g, cost, workspace).as_dict()


def optimize_graph(g: Graph, *, memory_limit: float | int | str | None = None,
                   latency_limit: float | str | None = None, time_budget: float = 60.0,
                   device: str | CostModel = "h200", seed: int = 0, max_states: int | None = None,
                   pareto: bool = False, settings: MoveSettings | None = None,
                   fission_dims: str = "batch", reorder: bool = True, workspace: WorkspaceSpec = "auto",
                   levels: int = DEFAULT_LEVELS, naive_fission_seed: int | None = None,
                   progress: Callable[[Progress], None] | None = None, jobs: int = 1,
                   eager_ratio: float = 1.0, plan_margin: float = 0.0) -> Optimized:
    """Search the rules on captured graph `g` under one limit (see peakcut.optimize).

    levels: L of Algorithm 1. naive_fission_seed: replace the F-Tree by random valid
    regions (the "naive fission" ablation of MAGIS §7.2.5). eager_ratio: the user's eager
    step's time as a multiple of the captured step's, when measured
    (peakcut.optimizer.context); a latency limit is a ratio to the user's eager step.
    plan_margin: under a latency limit, the share of it the search keeps free (it plans to
    limit x (1 - plan_margin)); the limit judged, reported and verified is the user's.
    """
    t0 = time.perf_counter()
    _check_arguments(memory_limit, latency_limit, fission_dims, time_budget, jobs, seed, max_states)
    named = get_cost_model(device) if isinstance(device, str) else device
    workspace = workspace_model(workspace, g.device)     # "auto": the GPU's own for a graph on a GPU
    unreachable = None if pareto else held_floor_refusal(g, memory_limit, named.name, workspace)
    if unreachable is not None:                 # no search: nothing it finds can meet the limit
        time_budget, reorder = 0.0, False
    cost = _budgeted(named, t0 + MEASURE_SHARE * time_budget)
    if jobs > 1 and isinstance(cost, BudgetedCost):
        raise ValueError(f"jobs={jobs} with device {cost.name!r}: a measured cost model measures op "
                         "latencies during the search, which parallel searches would disturb; use jobs=1")
    settings = _on_host(settings, cost)
    eager = simulate_timeline(g, g.order, cost, workspace)
    floors = _floors(g, cost, workspace)
    peer = _zero_offload(g, cost, workspace, floors)    # (before the search: inside its budget)
    if pareto:
        objective = Objective("latency", math.inf)
    elif memory_limit is not None:
        objective = Objective("memory", parse_memory_limit(memory_limit, eager.peak_bytes))
    else:
        ratio = DEFAULT_LATENCY_LIMIT if latency_limit is None else latency_limit
        objective = Objective("latency", parse_latency_limit(ratio, eager_ratio * eager.latency_seconds))

    planned = objective          # what the search plans to: the limit less the margin
    if plan_margin > 0 and objective.mode == "latency" and math.isfinite(objective.limit):
        planned = Objective("latency", objective.limit * (1 - plan_margin))

    base = detach_loss(g) if g.signature.mode != "inference" else g.copy()
    order = list(base.order)
    if reorder and time_budget > 0:
        found = schedule(base, time_limit=max(0.05, REORDER_SHARE * time_budget), workspace=workspace)
        order = list(found.order)
    if naive_fission_seed is None:
        tree, dgraph = find_ftree(base, order, levels, batch_only=fission_dims == "batch", workspace=workspace)
    else:
        tree, dgraph = random_ftree(base, order, naive_fission_seed, batch_only=fission_dims == "batch")
    deriver = Deriver(cost, workspace, levels=levels, batch_only=fission_dims == "batch")
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
    untransformed = root
    if time_budget > 0:
        root = with_root_rewrites(root, deriver, settings, None if pareto else planned)   # the front's fast end stays
    left = max(0.0, time_budget - (time.perf_counter() - t0))
    polishing = time_budget > 0 and not pareto and (settings is None or settings.uses(REWRITE_MOVES))
    result = parallel_search(root, deriver, planned, jobs=jobs, seed=seed, max_states=max_states,
                             time_budget=left * (1 - POLISH_SHARE) if polishing else left,
                             settings=settings, progress=progress, exact_front=pareto)
    polish_s = time.perf_counter()
    if polishing:
        result = polished(result, deriver, planned, deadline=t0 + time_budget)
    polish_s = time.perf_counter() - polish_s
    memory_method, latency_method = _methods(cost, workspace)
    best = result.best
    report = {
        "device": cost.name,
        "mode": objective.mode,
        "limit": objective.limit if math.isfinite(objective.limit) else None,
        "feasible": objective.feasible(best.peak_bytes, best.latency_s),
        "eager_peak_bytes": eager.peak_bytes,
        "eager_latency_s": eager.latency_seconds,
        "eager_ratio": eager_ratio,
        **_plan_entries(best, eager, eager_ratio),
        "memory_method": memory_method,
        "latency_method": latency_method,
        "capture_notes": list(g.signature.notes),
        "floors": floors.as_dict() if floors is not None else None,
        "overhead_vs_compute_floor": floors.overhead(best.latency_s) if floors is not None else None,
        "zero_offload": peer,
        "ftree": tree.summary(),
        "search": {"states": result.states, "expanded": result.expanded, "duplicates": result.duplicates,
                   "failed": result.failed, "seconds": round(result.seconds, 3),
                   "states_per_minute": round(result.states_per_minute, 1), "stopped": result.stopped,
                   "jobs": result.jobs, "plan_margin": plan_margin if planned is not objective else 0.0,
                   "compact_estimate": _estimate(best), "polish_s": round(polish_s, 3),
                   "time_budget_s": time_budget, "seed": seed, "total_seconds": round(time.perf_counter() - t0, 3)},
        "front": [{"peak_bytes": s.peak_bytes, "latency_s": s.latency_s, "applied": len(s.applied),
                   "exact": s.exact} for s in result.front],
    }
    if unreachable is not None:
        report["unreachable"] = unreachable.as_dict()
        report["search"]["stopped"] = "not searched: the limit is below the bytes held between steps"
    elif objective.mode == "memory" and not report["feasible"] and not best.compact:
        at_peak = simulate_timeline(best.program, best.order, cost, deriver.workspace)   # as the search priced it
        report["peak_standing"] = peak_standing(best.program, at_peak, best.tree).as_dict()
    if unreachable is None and objective.mode == "memory" and not report["feasible"]:
        whole = whole_op_floor(g, int(objective.limit), named.name, workspace)
        if whole is not None and root is not untransformed:   # plans from the rewritten root: their floor
            rewritten = whole_op_floor(root.base.with_order(root.base_order), int(objective.limit), named.name,
                                       workspace, as_run="after the root rewrites")
            whole = rewritten if rewritten is None or rewritten.floor_bytes < whole.floor_bytes else whole
        if whole is not None:
            report["whole_op_floor"] = whole.as_dict()
    return Optimized(result, objective, report, cost, eager, deriver, eager_ratio,
                     None if root is untransformed else untransformed)


def optimize(model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any] | None = None,
             optimizer: Any = "adamw", *, memory_limit: float | int | str | None = None,
             latency_limit: float | str | None = None, time_budget: float = 60.0,
             device: str | CostModel = "h200", seed: int = 0, max_states: int | None = None,
             pareto: bool = False, settings: MoveSettings | None = None, fission_dims: str = "batch",
             keep_grads: bool = False, progress: Callable[[Progress], None] | None = None,
             jobs: int = 1, max_grad_norm: float | None = None, scaler: Any = None, accumulate: int = 1,
             replan: bool = True, verify: bool = True, keep_host_memory: bool = True) -> Plan:
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
    opt = resolve_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    if accumulate > 1 and opt is None:
        raise ValueError("accumulate=k needs an optimizer; without one plan.step already adds into p.grad")
    search = dict(memory_limit=memory_limit, latency_limit=latency_limit, device=device, seed=seed,
                  max_states=max_states, pareto=pareto, settings=settings, fission_dims=fission_dims,
                  progress=progress, jobs=jobs)

    checked = (verify and not pareto and not use_scaler and accumulate == 1
               and (not isinstance(device, str) or device.startswith("measured"))
               and verify_runs_here(get_cost_model(device) if isinstance(device, str) else device, model))

    def plan_for(b: Any, budget: float) -> tuple[Program, Program | None]:
        t0 = time.perf_counter()
        final_share = budget if accumulate == 1 else budget * 0.6
        g = capture(model, b, loss_fn, opt, keep_grads=keep_grads, max_grad_norm=max_grad_norm,
                    grad_scaler=use_scaler, accumulate=accumulate > 1)
        check = None
        searched = search
        calibration = None
        cost = get_cost_model(device) if isinstance(device, str) else device
        if checked and loss_fn is not None and held_floor_refusal(g, memory_limit, cost.name) is None:
            eager = EagerStep(model, b, loss_fn, opt, max_grad_norm)
            if isinstance(cost, MeasuredCostModel):
                host_memory = _host_memory(model, keep_host_memory)
                calibration = calibrate(g, cost, model, b, eager, opt, CALIBRATE_SHARE * budget)
                if calibration.skipped:
                    warnings.warn(f"peakcut: per-op times not calibrated to a whole step: {calibration.skipped}",
                                  stacklevel=3)
                searched = dict(search, device=cost, eager_ratio=calibration.eager_ratio, plan_margin=PLAN_MARGIN)

            def check(found: Optimized, seconds: float) -> tuple[State, bool, str]:
                return _verified(found, seconds, model, b, eager, opt, calibration)
        keep = VERIFY_SHARE * final_share
        if calibration is not None and calibration.eager_step_s > 0:    # at least what verifying one plan takes
            # (a latency limit also runs the untransformed step; where the calibration's rounds
            # did not fit, time is short: eager and one plan. BERT-base at medium size, 85 s,
            # the calls measured afresh on a new CPU: VERIFY_SHARE kept 21 s, verifying needed 25)
            programs = 2 if memory_limit is not None or not calibration.eager_times else 3
            keep = max(keep, VERIFY_MARGIN * needed_seconds(calibration.eager_step_s, programs))
        main = _search(g, final_share - (time.perf_counter() - t0), model, searched, accumulate, check, keep=keep)
        if calibration is not None:
            main.report["context"] = dict(calibration.as_dict(), host_allocator=host_memory)
        micro = None
        if accumulate > 1:
            gm = capture(model, b, loss_fn, None, grad_scaler=use_scaler)
            micro = _search(gm, budget - (time.perf_counter() - t0), model, search, accumulate)
        return main, micro

    main, micro = plan_for(batch, time_budget)
    plan = Plan(model, main.graph, main.order, main.report, optimizer=opt, scaler=scaler, micro=micro,
                accumulate=accumulate, replan=(lambda b: plan_for(b, time_budget)) if replan else None,
                batch=batch)
    for program in (main, micro):
        if program is not None and not program.feasible and not pareto:
            raise LimitNotMet(program.why_not, plan, program.report.get("verification"))
    return plan


def _host_memory(model: torch.nn.Module, keep: bool) -> str:
    """Apply keep_freed_host_memory for a CPU model when asked; what was done, for the report."""
    if model_device(model).type != "cpu":
        return "not a CPU model: left alone"
    if not keep:
        return "left alone (keep_host_memory=False)"
    if keep_freed_host_memory():
        return "glibc malloc keeps freed memory (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)"
    return "left alone: not glibc"


def _verified(found: Optimized, seconds: float, model: torch.nn.Module, batch: Any, eager: EagerStep,
              opt: torch.optim.Optimizer | None,
              calibration: ContextCalibration | None) -> tuple[State, bool, str]:
    """The candidate that meets the limit when run (peakcut.optimizer.verify), whether one
    did, and why not; the verdict goes into found.report["verification"]."""
    mode = found.objective.mode
    t0 = time.perf_counter()
    report = found.report
    predicted = found.reference_s
    if seconds < needed_seconds(predicted):
        report["verification"] = {"skipped": f"{seconds:.1f} s of the time budget left; running eager and one "
                                  f"plan takes about {needed_seconds(predicted):.1f} s (raise time_budget)"}
        warnings.warn(f"peakcut: the plan was not verified by running it: {report['verification']['skipped']}; "
                      "its limit is met as predicted only", stacklevel=6)
        return found.best, found.feasible, ""
    candidates = found.candidates(programs_for(predicted, seconds, VERIFY_CANDIDATES))
    state, verdict = choose(candidates, found.captured, found.objective, predicted,
                            model, batch, eager, opt, max(0.0, seconds - (time.perf_counter() - t0)))
    report["verification"] = dict(verdict.report(mode), seconds=round(time.perf_counter() - t0, 3))
    if state is not found.best:
        report.update(_plan_entries(state, found.eager, found.eager_ratio),
                      search=dict(report["search"], compact_estimate=_estimate(state)))
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
        return state, True, ""
    report["feasible"] = False
    rejected = () if verdict.numbers is None else verdict.numbers.rejected
    if not verdict.candidates:
        reasons = "; ".join([*(f"{n}: numbers differ from eager's: {w}" for n, w in rejected),
                             *(f"{n}: {w}" for n, w in verdict.failed)])
        untransformed = candidate_name(found.captured, found.captured)
        captured = (" (the untransformed step too: the captured step does not compute what the eager step does)"
                    if any(n == untransformed for n, _ in rejected) else "")
        return state, False, (f"no candidate plan can be kept: none of them ran and computed eager's numbers"
                              f"{captured} ({reasons}); the plan on this error's .plan is unverified and may compute "
                              "other numbers; the check's figures are on .measured['numbers']")
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
    return state, False, why


def _whole_op(report: dict[str, Any]) -> str:
    """The whole-op floor's sentence for LimitNotMet (held_floor.whole_op_floor), or ''."""
    whole = report.get("whole_op_floor")
    return f"; {whole['text']}" if whole else ""


def _plan_entries(state: State, eager: Timeline, eager_ratio: float = 1.0) -> dict[str, Any]:
    """The report's entries that describe the plan `state` (predicted figures, what it does:
    its rewrites, fission regions and recipes; and `applied`, the search's path to it, undos
    and dropped recipes included); latency_ratio is to the user's eager step (eager_ratio x
    the captured step's time)."""
    return {"peak_bytes": state.peak_bytes, "peak_ratio": state.peak_bytes / eager.peak_bytes,
            "latency_s": state.latency_s,
            "latency_ratio": state.latency_s / (eager_ratio * eager.latency_seconds) if eager.latency_seconds else None,
            "applied": list(state.applied),
            "rewrites": list(state.rewrites),
            "fission": [{"ftree_node": k, "n": n, "ops": len(state.tree.nodes[k].nodes)} for k, n in state.fission()],
            "recipes": [r.description for r in state.recipes]}


def _search(g: Graph, budget: float, model: torch.nn.Module, search: dict[str, Any], accumulate: int,
            check: Callable[[Optimized, float], tuple[State, bool, str]] | None = None,
            keep: float | None = None) -> Program:
    """optimize_graph on one captured step -> its Program (best graph, order, report); with
    `check`, the search leaves `keep` seconds (default VERIFY_SHARE of the budget) and
    check(found, seconds left) picks the plan that meets the limit when run."""
    t0 = time.perf_counter()
    budget = max(0.0, budget)       # what capture and calibration left of the user's time budget
    keep = 0.0 if check is None else min(keep, budget) if keep is not None else VERIFY_SHARE * budget
    found = optimize_graph(g, time_budget=max(0.0, budget - keep), **search)
    found.report["title"] = f"peakcut plan for {type(model).__name__}"
    sig = g.signature
    spec = OptimizerSpec.from_dict(sig.optimizer)
    found.report["step"] = {
        "mode": sig.mode, "optimizer": None if spec is None else spec.kind,
        "param_groups": 0 if spec is None else len(spec.groups), "max_grad_norm": sig.max_grad_norm,
        "grad_scaler": sig.grad_scaler, "accumulate": accumulate,
    }
    why = ""
    if not found.feasible:
        mode = found.objective.mode
        what = "peak" if mode == "memory" else "latency"
        have = format_bytes(found.best.peak_bytes) if mode == "memory" else format_seconds(found.best.latency_s)
        want = format_bytes(found.objective.limit) if mode == "memory" else format_seconds(found.objective.limit)
        r = found.result
        why = (f"{what} limit not met: best {have}, limit {want} ({r.states} states searched in "
               f"{r.seconds:.3g} s of a {budget:.3g} s budget; stopped: {r.stopped}); the best plan is on "
               "this error's .plan")
        standing = found.report.get("peak_standing")
        if standing is not None:
            why += f"; {standing['text']}"
        why += _whole_op(found.report)
        unreachable = found.report.get("unreachable")
        if unreachable:
            why = (f"{what} limit not met, not searched: {unreachable['text']}. The untransformed step is on this "
                   "error's .plan")
    best, feasible = found.best, found.feasible
    if check is not None and not found.report.get("unreachable"):
        best, feasible, measured_why = check(found, budget - (time.perf_counter() - t0))
        why = "" if feasible else (measured_why + _whole_op(found.report) if measured_why else why)
    return Program(best.program, list(best.order), found.report, feasible, why)
