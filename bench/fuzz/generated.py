"""One fuzz case of the generated substitutions: units of rules' source graphs in one training
step, every site of the search's own GeneratedRule applied, the program against eager.

A case draws a dtype (float64, float32 or float32 under bf16 autocast, as bench.fuzz.models
draws them) and an optimizer recipe (bench.fuzz.models), builds a UnitsModel of the given
rules' units (bench.fuzz.generated_model), captures its step with peakcut.capture and lists
the sites of the registry's GeneratedRule (peakcut.rules.RULES: the rule object the search
uses). Each unit's own site (its rule, at a node of its module) is applied first; then every
other site of any rule that still applies (in the loss, in the backward, another rule at a
unit's nodes), each through GeneratedRule.why_not and GeneratedRule.apply. The program is
then run next to eager for 3 steps, `runs` times with fresh random parameters and batch
(the same capture and program; each run its own seed), and compared as bench.fuzz.loop
compares the user's loop (loss, gradients, parameters, optimizer state; elementwise within
rounding_tolerance(dtype, largest tensor, 3), parameters and state also within what gradient
differences of that size do through the optimizer, shown by an eager loop whose gradients are
nudged by them; norm-wise under autocast, never below float32's absolute floor), one comparer
per unit, so that a difference names the unit's rule and each rule has its own largest
difference as a fraction of what is allowed. The loss is one sum over all units: a loss
that differs counts against every rule applied in the case; so does, under autocast, any
difference (norm-wise over the case's values of a kind, as bench.fuzz.loop judges a model).
"""

from __future__ import annotations

import copy
import random
import re
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

import peakcut
from bench.fuzz.blocks import flip
from bench.fuzz.generated_model import UnitsModel, UnitSpec
from bench.fuzz.loop import (
    LoopReport,
    UserLoop,
    _Compare,
    _EagerLoop,
    _state_pairs,
    autocast_tolerance,
)
from bench.fuzz.models import _optimizer
from peakcut.codegen.program import Step
from peakcut.ir.graph import Graph
from peakcut.rules import RULES
from peakcut.rules.generated_rule import GeneratedRule
from peakcut.rules.query import Query
from peakcut.runtime.equivalence import rounding_tolerance, torch_optimizer
from peakcut.transform.rewrite import RuleError
from peakcut.transform.site import RewriteSite

STEPS = 3
LOSS = -1      # the unit index of what no unit owns: the loss (a sum over all units)


def search_rule() -> GeneratedRule:
    """The GeneratedRule instance of the registry the search uses."""
    rule = RULES.rewrite_rule("generated")
    if not isinstance(rule, GeneratedRule):
        raise TypeError(f"RULES' 'generated' rule is a {type(rule).__name__}, not a GeneratedRule")
    return rule


@dataclass
class GenOutcome:
    """One case: which rules were applied where, and how each unit compared."""

    seed: int
    dtype: str                                   # float64 | float32 | bf16 autocast
    specs: list[UnitSpec]
    runs: int = 0
    status: str = "ok"                           # ok | mismatch | crash
    applied: Counter = field(default_factory=Counter)      # rule index -> sites applied
    owners: dict[int, set[int]] = field(default_factory=dict)   # rule index -> units (LOSS) it was applied in
    own: set[int] = field(default_factory=set)             # units whose own site was applied
    missed: dict[int, str] = field(default_factory=dict)   # unit -> why its own site was not applied
    bad_units: set[int] = field(default_factory=set)       # units that differ (LOSS: the loss)
    worst: dict[int, float] = field(default_factory=dict)  # unit (LOSS) -> largest difference / allowed
    detail: str = ""
    seconds: float = 0.0

    def rule_ok(self, index: int) -> bool:
        """The rule's applications kept eager's numbers in every run of the case."""
        if self.status == "crash":
            return False
        units = self.owners.get(index, set())
        return LOSS not in self.bad_units and not units & self.bad_units

    def rule_worst(self, index: int) -> float:
        units = self.owners.get(index, set()) | {LOSS}
        return max((self.worst.get(u, 0.0) for u in units), default=0.0)


def _unit_of(module: str) -> int:
    m = re.match(r"units\.(\d+)(\.|$)", module)
    return int(m.group(1)) if m else LOSS


def _reason(text: str) -> str:
    """A refusal's message without its node and tensor ids, so that refusals group."""
    return re.sub(r"\d+", "#", text.split("\n")[0])[:90]


def apply_sites(g: Graph, specs: list[UnitSpec], out: GenOutcome,
                rule: GeneratedRule) -> tuple[Graph, list[int]]:
    """Every site of `rule` in g: each unit's own first, then the rest."""
    sites = list(rule.sites(Query(g, g.order)))
    own = {(j, s.index): j for j, s in enumerate(specs)}
    first: list[tuple[int, RewriteSite]] = []
    rest: list[tuple[int, RewriteSite]] = []
    for site in sites:
        unit = _unit_of(g.nodes[site.nodes[0]].module)
        (first if (unit, site.params[0]) in own else rest).append((unit, site))
    found = {unit for unit, _ in first}
    for j in range(len(specs)):
        if j not in found:
            out.missed[j] = f"no site of its source in the capture ({out.dtype})"
    order = list(g.order)
    for unit, site in first + rest:
        mine = (unit, site.params[0]) in own
        if mine and unit in out.own:
            mine = False
        why = rule.why_not(g, order, site)
        if why is not None:
            if mine and unit not in out.own:
                out.missed.setdefault(unit, _reason(why))
            continue
        try:
            rw = rule.apply(g, order, site)
        except RuleError as e:
            if mine:
                out.missed.setdefault(unit, _reason(str(e)))
            continue
        g, order = rw.graph, list(rw.order)
        out.applied[site.params[0]] += 1
        out.owners.setdefault(site.params[0], set()).add(unit)
        if mine:
            out.own.add(unit)
            out.missed.pop(unit, None)
    return g, order


def _param_unit(name: str, autocast: bool = False) -> int:
    return LOSS if autocast else _unit_of(name.rpartition(".")[0])


def compare_run(model: UnitsModel, batch: tuple[torch.Tensor, ...], autocast: bool, recipe: Any,
                program: Graph, order: list[int], tol: float, seed: int,
                reports: dict[int, LoopReport], step_tol: float = 0.0) -> None:
    """`STEPS` steps of eager and of the program (bench.fuzz.loop.run_user_loop's loop), each
    value compared by its unit's comparer (LOSS: the loss's). Under autocast every value goes
    to LOSS's: norm-wise, all gradients (parameters, state) of the case together, as the
    harness judges a model (a unit's gradient that is zero up to rounding is noise in eager
    and in any program, and proves nothing alone). step_tol: one step's tolerance, by which
    an eager loop's gradients are nudged to show what the optimizer makes of such differences."""
    def loss_fn(m: torch.nn.Module, b: Any) -> torch.Tensor:
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return m(*b)
        return m(*b)

    loop = UserLoop(lambda m: torch_optimizer(recipe, m.parameters()))
    compare = {u: _Compare(r) for u, r in reports.items()}
    ref = _EagerLoop(model, loss_fn, loop)
    precise = _EagerLoop(model, lambda m, b: m(*b), loop) if autocast else None
    nudged = None if autocast else _EagerLoop(model, loss_fn, loop, nudge=step_tol)
    ours = copy.deepcopy(model)
    our_opt = loop.make_optimizer(ours)
    step = Step(program, order, optimizer=our_opt)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for k in range(1, STEPS + 1):
        ref_loss, ref_grads = ref.step(batch, seed + k)
        near_loss, near_grads = precise.step(batch, seed + k) if precise is not None else (None, {})
        if nudged is not None:
            nudged.step(batch, seed + k)
        torch.manual_seed(seed + k)
        loss = step(ours, batch)
        for name, p in ours.named_parameters():
            if name in ref_grads or p.grad is not None:
                compare[_param_unit(name, autocast)](k, f"gradient {name}", p.grad, ref_grads.get(name), None,
                                           near_grads.get(name))
        our_opt.zero_grad()
        compare[LOSS](k, "loss", loss.detach(), ref_loss, None, near_loss)
        ref_params = dict(ref.model.named_parameters())
        near_params = dict(precise.model.named_parameters()) if precise is not None else {}
        nudged_params = dict(nudged.model.named_parameters()) if nudged is not None else {}
        for name, p in ours.named_parameters():
            compare[_param_unit(name, autocast)](k, f"parameter {name}", p, ref_params[name], start[name],
                                       near_params.get(name), nudged_params.get(name))
        near_state = {w: b for w, _, b in _state_pairs(precise.opt, precise.opt)} if precise is not None else {}
        nudged_state = {w: b for w, _, b in _state_pairs(nudged.opt, nudged.opt)} if nudged is not None else {}
        for what, a, b in _state_pairs(our_opt, ref.opt):
            m = re.match(r"optimizer state (\d+)\.", what)
            unit = _param_unit(names[int(m.group(1))], autocast) if m else LOSS
            compare[unit](k, what, a, b, torch.zeros_like(b) if isinstance(b, torch.Tensor) else None,
                          near_state.get(what), nudged_state.get(what))
        for c in compare.values():
            c.finish_step(k)


def run_generated_case(specs: list[UnitSpec], seed: int, runs: int = 1,
                       rule: GeneratedRule | None = None) -> GenOutcome:
    """Capture the units of `specs` in one step, apply every site of `rule` (default: the
    search's, search_rule(); specs' indices are into rule.rules()), compare with eager `runs`
    times."""
    rule = search_rule() if rule is None else rule
    t0 = time.perf_counter()
    rng = random.Random(seed)
    dtype = torch.float64 if flip(rng, 0.6) else torch.float32
    autocast = dtype == torch.float32 and flip(rng, 0.5)
    out = GenOutcome(seed, "bf16 autocast" if autocast else str(dtype).removeprefix("torch."), specs)
    recipe = _optimizer(rng, dtype)
    where = "capture"
    try:
        torch.manual_seed(seed)
        model = UnitsModel(specs, dtype).train()
        batch = model.make_batch(dtype)

        def loss_fn(m: torch.nn.Module, b: Any) -> torch.Tensor:
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return m(*b)
            return m(*b)

        g = peakcut.capture(model, batch, loss_fn, recipe, keep_grads=True)
        where = "applying the sites"
        program, order = apply_sites(g, specs, out, rule)
        largest = max((t.numel for t in g.tensors.values()), default=1)
        tol = autocast_tolerance(STEPS) if autocast else rounding_tolerance(dtype, largest, STEPS)
        # under autocast, norm-wise, never stricter than the float32 judge's absolute floor: a
        # rule may compute exactly what the source leaves as rounding noise (a - (b + a) + b)
        floor = rounding_tolerance(torch.float32, largest, STEPS) if autocast else 0.0
        reports = {u: LoopReport(tol, autocast, floor=floor) for u in [LOSS, *range(len(specs))]}
        for r in range(runs):
            where = f"run {r}"
            if r:      # fresh values for the same capture and program
                torch.manual_seed(seed * 1000 + r)
                model = UnitsModel(specs, dtype).train()
                batch = model.make_batch(dtype)
            compare_run(model, batch, autocast, recipe, program, order, tol, seed * 1000 + r, reports,
                        step_tol=0.0 if autocast else rounding_tolerance(dtype, largest, 1))
            out.runs += 1
        for u, rep in reports.items():
            out.worst[u] = rep.worst
            if not rep.ok:
                out.bad_units.add(u)
                who = "the loss" if u == LOSS else specs[u].describe()
                out.detail += f"{who}: {rep}\n"
        if out.bad_units:
            out.status = "mismatch"
    except Exception as e:  # noqa: BLE001 - a crash is an outcome to report, with where it happened
        out.status = "crash"
        out.detail = f"{where}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}"
    out.seconds = time.perf_counter() - t0
    return out
