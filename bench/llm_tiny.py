"""Model state in host memory at tiny size, measured on this CPU (issue 17).

    python -m bench.llm_tiny [--workloads bert-base llama2-7b gpt2-xl] [--steps 3]

For each tiny transformer, one AdamW step captured with the user's own torch.optim.AdamW, then
every parameter and its moments kept in host memory and every update run on the host (the
registry's offload_param, offload_state and host_update rules at every parameter, in that
order; the gradients go to host memory once made, for the host update). The plan runs next to
eager for --steps steps (same initial weights and optimizer), and the table gives: the
simulated device peak of the plain captured step and of the plan, the plan's measured device
peak (torch.profiler allocator events, peakcut.measure "cpu-profiler"), the host buffers
simulated (codegen.swap.simulated_host_peak) and measured (Step.host_peak_bytes), and the
largest difference from eager over loss, parameters and optimizer state. Checked by
tests/rules/test_host_update.py::test_a_tiny_transformer_with_its_update_on_the_host.
"""

from __future__ import annotations

import argparse
import copy
import platform

import torch

import peakcut
from peakcut.codegen.swap import simulated_host_peak
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.units import format_bytes
from peakcut.workloads import get_workload

MOVES = (("offload_param", Role.PARAM), ("offload_state", Role.OPT_STATE), ("host_update", Role.PARAM))


def everything_on_host(g: Graph) -> tuple[Graph, list[int], dict[str, int]]:
    """MOVES at every input of their role, each rule over all its sites in one edit."""
    order = list(g.order)
    applied = {}
    for kind, role in MOVES:
        sites = [HotspotSite(t, -1, (), g.tensors[t].nbytes, 0) for t in g.inputs if g.tensors[t].role is role]
        rw, reasons = RULES.program_rule(kind).apply_many(g, order, sites)
        applied[kind] = sum(r is None for r in reasons)
        if rw is not None:
            g, order = rw.graph, rw.order
    return g, order, applied


def run(name: str, steps: int) -> dict:
    inst = get_workload(name).build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=1e-2)
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, opt)
    g, order, applied = everything_on_host(plain)
    step = peakcut.build(g, order, optimizer=opt)
    measured = peakcut.measure(step, model, inst.batch, method="cpu-profiler", repeats=1).peak_bytes
    worst = 0.0
    for _ in range(steps):
        loss = step(model, inst.batch)
        ref_loss = inst.loss_fn(ref, inst.batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        worst = max(worst, (loss - ref_loss.detach()).abs().item())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        worst = max(worst, (p - q).abs().max().item())
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            worst = max(worst, (ours[i][slot].float() - value.float()).abs().max().item())
    return {"workload": name, "ops": len(plain.nodes), "applied": applied,
            "plain_simulated": simulate(plain, plain.order).peak_bytes,
            "plan_simulated": simulate(g, order).peak_bytes, "plan_measured": measured,
            "host_simulated": simulated_host_peak(g, order), "host_measured": step.host_peak_bytes,
            "worst_difference": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="*", default=["bert-base", "llama2-7b", "gpt2-xl"])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    print(f"bench.llm_tiny on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {args.steps} AdamW steps; peaks: simulated and measured (cpu-profiler)\n")
    print("| workload (ops) | moves applied | plain step peak (sim.) | plan peak sim. / measured | "
          "host buffers sim. / measured | largest difference from eager |")
    print("|---|---|---|---|---|---|")
    for name in args.workloads:
        r = run(name, args.steps)
        moves = ", ".join(f"{k} {v}" for k, v in r["applied"].items())
        print(f"| {name} ({r['ops']:,}) | {moves} | {format_bytes(r['plain_simulated'])} | "
              f"{r['plan_simulated']:,} B / {r['plan_measured']:,} B | "
              f"{r['host_simulated']:,} B / {r['host_measured']:,} B | {r['worst_difference']:.1e} |")


if __name__ == "__main__":
    main()
