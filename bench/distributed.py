"""FSDP2 steps of Llama-2 at scale, simulated: per-rank peak and step time of FSDP2 as people
run it against peakcut's plans.

    python -m bench.distributed                         # 7B and 13B: 8 x H100, 8 x H200, 2 x 8 H100 over IB
    python -m bench.distributed --rows 70b:h100x8 --budget 60
    python -m bench.distributed --rows tiny:h100x4 --budget 1 --out /tmp/t.md

Nothing runs on a GPU and no other process starts. One process joins torch's fake process group
(`fake_pg.FakeStore`, every collective a no-op) as rank 0 of the row's world, builds the
LlamaForCausalLM on the meta device in bf16, applies `fully_shard` to every decoder layer and the
root over a 1-D mesh, and captures one AdamW step with clipping at 1.0
(`peakcut.capture(..., fully_sharded=describe_fully_sharded(model))`): the graph holds each
parameter's all-gather from its shard and its gradient's reduce-scatter. Every figure is then
simulated on that graph: peakcut's timeline (compute, copy and communication streams) under the
analytic H100 / H200 profile, collectives priced on NVLink 4 within a node or InfiniBand NDR
(`cost.links`) for the 2-node rows; memory with the CPU workspace model, as bench.llm.

Columns, each a per-rank peak and step time:

- captured: the step as captured (every full parameter kept from its forward gather to its
  backward use), in capture order; the reference of the 1.10 latency limit.
- FSDP2 (a): reshard after forward: peakcut's regather move on every decoder layer's parameter
  for its readers after the loss (the root's stay gathered, as FSDP2 keeps the root's). Every
  column's collectives run where peakcut's programs run them (`ir.collectives.
  overlapped_order`): each reduce-scatter as soon as its gradient is made, and the gathers
  ahead of their readers with at most twice the largest gather's bytes gathered and not yet
  read (FSDP2 holds the unit it runs and the next one it prefetched). (b): (a) after checkpoint_blocks on every decoder layer. (c): (a) with the optimizer state and update on the host
  (optimizer.baselines' ZeRO-Offload-style plan) and the parameter shards on the host
  (CPUOffloadPolicy): their bytes are taken off (a)'s device peak, an estimate.
- peakcut: `optimize_graph` at latency <= 1.10 x captured, and at per-GPU memory limits of 40 and
  24 GB; a limit the search does not meet shows its best plan and why (the LimitNotMet text).

70B (`--rows 70b:h100x8`) is not a default: it captures (33,500 ops, 25 s); its searches take minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.links import INFINIBAND_NDR, LinkProfile, node_link
from peakcut.cost.profiles import H100, H200, DeviceProfile
from peakcut.ir.collectives import ALL_GATHER_OP
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.limit_messages import search_shortfall
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.schedule.placement import place
from peakcut.simulate import simulate_timeline
from peakcut.transform.checkpoint import checkpoint_blocks, find_blocks
from peakcut.transform.regather import RegatherTag, backward_readers
from peakcut.units import format_bytes, format_seconds

# Llama-2 dims (the published config.json files); tiny: the workloads' 2-layer sibling
MODELS: dict[str, dict[str, int]] = {
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32},
    "13b": {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 40},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8},
}
PROFILES: dict[str, DeviceProfile] = {"h100": H100, "h200": H200}
RANKS_PER_NODE = 8
DEFAULT_ROWS = ("7b:h100x8", "7b:h200x8", "7b:h100x16", "13b:h100x8", "13b:h200x8", "13b:h100x16")
LIMITS = ("40GB", "24GB")
LATENCY_LIMIT = 1.1
PEERS = ("captured", "fsdp2", "fsdp2_ac", "fsdp2_offload")


@dataclass(frozen=True)
class Row:
    """One table row: a model, a device profile and a world size (over 8 ranks: 2+ nodes on IB)."""

    model: str
    profile: str
    world: int

    @classmethod
    def parse(cls, text: str) -> Row:
        """'7b:h100x8' -> Row('7b', 'h100', 8); ValueError naming the bad part."""
        try:
            model, rest = text.split(":")
            profile, world = rest.split("x")
            row = cls(model, profile, int(world))
        except ValueError:
            raise ValueError(f"--rows: {text!r} is not MODEL:PROFILExRANKS (e.g. 7b:h100x8)") from None
        if row.model not in (*MODELS, "tiny") or row.profile not in PROFILES or row.world < 2:
            raise ValueError(f"--rows: {text!r}: model one of {[*MODELS, 'tiny']}, profile one of "
                             f"{list(PROFILES)}, at least 2 ranks")
        return row

    @property
    def link(self) -> LinkProfile:
        """NVLink within one node; InfiniBand NDR when the ranks span nodes."""
        return INFINIBAND_NDR if self.world > RANKS_PER_NODE else node_link(self.profile)

    def cost(self) -> AnalyticCostModel:
        return AnalyticCostModel(PROFILES[self.profile], link=self.link)

    def label(self) -> str:
        nodes, gpu = -(-self.world // RANKS_PER_NODE), self.profile.upper()
        return (f"{self.world} x {gpu}" if nodes == 1 else f"{nodes} nodes x {RANKS_PER_NODE} {gpu}") + f" ({self.link.name})"


@dataclass
class Cell:
    """One simulated figure pair, how it was made, and what limits it where it misses."""

    peak_bytes: int
    latency_s: float
    method: str
    met: bool = True
    note: str = ""


@contextmanager
def fake_ranks(world: int) -> Iterator[Any]:
    """torch's fake process group of `world` ranks, this process rank 0, and a 1-D CPU mesh on it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("bench.distributed: a process group is already initialized in this process; "
                           "run the bench in a process of its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def llama(model: str, mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Llama-2 `model` on the meta device in bf16, fully_shard'ed per layer and at the root; its AdamW."""
    from torch.distributed.fsdp import fully_shard

    from peakcut.workloads.hf import transformers_module
    from peakcut.workloads.llm import llama2_7b_config

    if model == "tiny":
        cfg = llama2_7b_config("tiny")
    else:
        base = llama2_7b_config("paper")
        cfg = type(base)(**{**base.to_dict(), **MODELS[model], "head_dim": 128})
    with torch.device("meta"):
        module = transformers_module().LlamaForCausalLM(cfg).to(torch.bfloat16)
    for layer in module.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module, torch.optim.AdamW(module.parameters(), lr=1e-4), cfg


def capture_step(model: str, world: int, batch: int, seq: int) -> tuple[Graph, float]:
    """The captured FSDP2 step of `model` on rank 0 of `world` fake ranks, and its capture seconds."""
    import peakcut
    from peakcut.spec.fully_sharded import describe_fully_sharded
    from peakcut.workloads.hf import causal_lm_loss

    with fake_ranks(world) as mesh:
        module, opt, cfg = llama(model, mesh)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="meta")
        data = (ids, torch.ones(batch, seq, dtype=torch.long, device="meta"), ids)
        t0 = time.perf_counter()
        g = peakcut.capture(module, data, causal_lm_loss, opt, fully_sharded=describe_fully_sharded(module),
                            max_grad_norm=1.0, device="cpu")
        return g, time.perf_counter() - t0


def unit_of(g: Graph, gather: int) -> str:
    """The fully_shard unit whose parameter all-gather node `gather` gathers: 'model.layers.<i>',
    or '' for the root's (embeddings, final norm, LM head)."""
    names = dict(zip(g.inputs, g.input_names, strict=True))
    t: int | None = g.nodes[gather].input_tuple[0]
    while t is not None and t not in names:
        p = g.producer(t)
        t = g.nodes[p].input_tuple[0] if p is not None and g.nodes[p].input_tuple else None
    name = names.get(t, "").split(":", 1)[-1] if t is not None else ""
    return ".".join(name.split(".")[:3]) if name.startswith("model.layers.") else ""


def backward_gather_sites(g: Graph, order: list[int]) -> list[HotspotSite]:
    """A regather site for every decoder layer's all-gather whose full parameter the backward
    reads (its readers there); the root's parameters stay gathered, as FSDP2 keeps the root's."""
    sites = []
    for nid in order:
        node = g.nodes[nid]
        if node.op == ALL_GATHER_OP and node.outputs[0] is not None and unit_of(g, nid):
            users = backward_readers(g, nid)
            size = g.storages[g.tensors[node.outputs[0]].storage]
            if users:
                sites.append(HotspotSite(node.outputs[0], nid, users, size, size))
    return sites


def resharded(g: Graph, order: list[int]) -> tuple[Graph, list[int]]:
    """`g` with every decoder layer's parameter gathered again for the backward (FSDP2's reshard
    after forward), each new gather, wait and view right before its first reader."""
    rule = RULES.program_rule("regather")
    rw, reasons = rule.apply_many(g, order, backward_gather_sites(g, order))
    refused = [r for r in reasons if r is not None]
    if rw is None or refused:
        raise RuntimeError(f"regather refused {len(refused)} parameter(s): {refused[:1]}")
    return rw.graph, rw.order


def host_updated(g: Graph, order: list[int], cost: AnalyticCostModel) -> tuple[Graph, list[int], int]:
    """`g` with every parameter's optimizer state and update on the host (host_update, as
    optimizer.baselines' ZeRO-Offload-style peer), its new nodes placed; updates it refused."""
    rule = RULES.program_rule("host_update")
    params = [t for t in g.inputs if g.tensors[t].role is Role.PARAM]
    rw, reasons = rule.apply_many(g, order, [HotspotSite(t, -1, (), g.tensors[t].nbytes, 0) for t in params])
    if rw is None:
        raise RuntimeError(f"host_update refused every parameter: {reasons[:1]}")
    ours = {n: p for n, p in RULES.placements(rw.graph).items() if rw.graph.nodes[n].tags.get(RegatherTag) is None}
    return rw.graph, place(rw.graph, rw.order, cost, placements=ours), sum(r is not None for r in reasons)


def _cell(g: Graph, order: list[int], cost: AnalyticCostModel, method: str, minus: int = 0) -> Cell:
    return Cell((tl := simulate_timeline(g, order, cost)).peak_bytes - minus, tl.latency_seconds, method)


def peer(name: str, g: Graph, cost: AnalyticCostModel) -> Cell:
    """FSDP2 configuration `name` (PEERS) of captured step `g`, simulated under `cost`."""
    order = list(g.order)
    how = "simulated (the row's profile and link"
    if name == "captured":
        return _cell(g, order, cost, how + ", capture order)")
    if name not in PEERS:
        raise ValueError(f"peer {name!r}: expected one of {PEERS}")
    how += ", regather on every layer's parameters"
    if name == "fsdp2_ac":
        blocks = [b for bs in find_blocks(g).values() for b in bs]
        rw, why = checkpoint_blocks(g, order, blocks)
        if rw is None or any(why):
            raise RuntimeError(f"checkpoint_blocks refused: {[w for w in why if w][:1]}")
        g, order = rw.graph, rw.order
        how += ", checkpoint_blocks on every layer"
    rg, ro = resharded(g, order)
    if name != "fsdp2_offload":
        return _cell(rg, ro, cost, how + ")")
    program, placed, refused = host_updated(rg, ro, cost)
    shards = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is Role.PARAM)
    cell = _cell(program, placed, cost, how + ", optimizer state and update on the host; "
                 f"the parameter shards' {format_bytes(shards)} taken off the peak: an estimate)", minus=shards)
    cell.note = f"{refused} update(s) kept on the device" if refused else ""
    return cell


def planned(g: Graph, cost: AnalyticCostModel, limit: str, budget: float) -> tuple[Cell, dict[str, Any]]:
    """peakcut's plan under `limit` ('latency' or a memory limit), simulated, and its search figures."""
    t0 = time.perf_counter()
    if limit == "latency":
        found = optimize_graph(g, latency_limit=LATENCY_LIMIT, device=cost, time_budget=budget)
    else:
        found = optimize_graph(g, memory_limit=limit, device=cost, time_budget=budget)
    r = found.report
    cell = Cell(int(r["peak_bytes"]), float(r["latency_s"]), "simulated (the row's profile and link, peakcut's plan)",
                met=bool(r["feasible"]), note="" if r["feasible"] else search_shortfall(found, budget))
    stats = {"states": r["search"]["states"], "wall_s": round(time.perf_counter() - t0, 1),
             "rewrites": r.get("rewrites", []), "fission": len(r.get("fission", []))}
    return cell, stats


def run_row(row: Row, g: Graph, budget: float, limits: tuple[str, ...]) -> dict[str, Any]:
    """Every column of `row` on its captured step `g`."""
    cost = row.cost()
    out: dict[str, Any] = {"row": asdict(row), "label": row.label(), "nodes": len(g.nodes), "cells": {},
                           "search": {}, "errors": {}}
    for name in PEERS:
        try:
            out["cells"][name] = asdict(peer(name, g, cost))
        except (RuntimeError, ValueError) as e:       # a move the peer needs refused: say so in the table
            out["errors"][name] = f"{type(e).__name__}: {e}"
    for limit in ("latency", *limits):
        cell, stats = planned(g, cost, limit, budget)
        out["cells"][f"peakcut {limit}"] = asdict(cell)
        out["search"][limit] = stats
        print(f"# {row.label()} {row.model} {limit}: peak {format_bytes(cell.peak_bytes)}, "
              f"{format_seconds(cell.latency_s)}, {'met' if cell.met else 'NOT met'}", flush=True)
    return out


def verdict(result: dict[str, Any]) -> str:
    """Whether peakcut's plan at <= 1.10 holds less than every FSDP2 peer that is not faster."""
    ours = result["cells"].get("peakcut latency")
    peers = [result["cells"][p] for p in ("fsdp2", "fsdp2_ac", "fsdp2_offload") if p in result["cells"]]
    rivals = [p for p in peers if p["latency_s"] >= ours["latency_s"]]
    if not rivals:
        return "every FSDP2 peer is faster"
    best = min(rivals, key=lambda p: p["peak_bytes"])
    return ("yes" if ours["peak_bytes"] < best["peak_bytes"] else "no") + \
        f" (best peer not faster: {format_bytes(best['peak_bytes'])} at {format_seconds(best['latency_s'])})"


def _fig(cell: dict[str, Any] | None, error: str | None = None) -> str:
    if cell is None:
        return "n/a" if error is None else "refused"
    text = f"{format_bytes(cell['peak_bytes'])} / {format_seconds(cell['latency_s'])}"
    return text if cell["met"] else f"not met: best {text}"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The table, its notes and the command, as markdown."""
    cols = [*PEERS, "peakcut latency", *(f"peakcut {lim}" for lim in args.limits)]
    heads = ["captured (no reshard)", "FSDP2 reshard after forward", "FSDP2 + per-block AC",
             "FSDP2 + CPUOffloadPolicy", "peakcut <= 1.10", *(f"peakcut {lim}/GPU" for lim in args.limits)]
    out = ["Per-rank peak / step time, **simulated** (peakcut timeline, analytic device profile, link as "
           f"named; nothing runs; GiB). Batch per rank {args.batch} x {args.seq} tokens, bf16 weights and "
           "AdamW moments, clipping at 1.0. Command: `python -m bench.distributed "
           f"--rows {' '.join(args.rows)} --budget {args.budget:g}`.", "",
           "| model | ranks (link) | ops | " + " | ".join(heads) + " | peakcut <= 1.10 below best FSDP2 |",
           "|" + "---|" * (len(heads) + 4)]
    notes: list[str] = []
    for r in results:
        cells = [_fig(r["cells"].get(c), r["errors"].get(c)) for c in cols]
        out.append(f"| Llama-2-{r['row']['model']} | {r['label']} | {r['nodes']:,} | " + " | ".join(cells) +
                   f" | {verdict(r)} |")
        for c in cols:
            cell = r["cells"].get(c)
            if cell is not None and not cell["met"]:
                notes.append(f"- Llama-2-{r['row']['model']}, {r['label']}, {c}: {cell['note']}")
            if c in r["errors"]:
                notes.append(f"- Llama-2-{r['row']['model']}, {r['label']}, {c} refused: {r['errors'][c]}")
    out += ["", "Searches (states built, wall seconds on this machine, `--budget` each):", ""]
    for r in results:
        s = "; ".join(f"{k}: {v['states']} states, {v['wall_s']} s" for k, v in r["search"].items())
        out.append(f"- Llama-2-{r['row']['model']}, {r['label']}: capture {r['capture_s']:.1f} s; {s}")
    if notes:
        out += ["", "Limits not met and peers refused:", "", *notes]
    methods = {c: cell["method"] for r in results for c, cell in r["cells"].items()}
    out += ["", "How each column is made:", "", *(f"- {c}: {m}" for c, m in methods.items())]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), help="MODEL:PROFILExRANKS, e.g. 7b:h100x8")
    ap.add_argument("--limits", nargs="*", default=list(LIMITS), help="per-GPU memory limits")
    ap.add_argument("--budget", type=float, default=60.0, help="search seconds per cell")
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank (default 1; tiny 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 2048; tiny 32)")
    ap.add_argument("--out", default="bench/distributed.md", help="markdown output")
    ap.add_argument("--json", default=None, help="also write every figure as JSON here")
    ap.add_argument("--render", default=None, help="only write the markdown of a JSON an earlier run wrote")
    args = ap.parse_args(argv)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        args.rows = [f"{r['row']['model']}:{r['row']['profile']}x{r['row']['world']}" for r in results]
        args.batch, args.seq = args.batch or 1, args.seq or 2048
        Path(args.out).write_text(markdown(results, args))
        return results
    rows = [Row.parse(text) for text in args.rows]
    tiny = all(r.model == "tiny" for r in rows)
    args.batch = args.batch or (2 if tiny else 1)
    args.seq = args.seq or (32 if tiny else 2048)
    graphs: dict[tuple[str, int], tuple[Graph, float]] = {}
    results = []
    for row in rows:
        key = (row.model, row.world)
        if key not in graphs:
            graphs[key] = capture_step(row.model, row.world, args.batch, args.seq)
        g, capture_s = graphs[key]
        result = run_row(row, g, args.budget, tuple(args.limits))
        result["capture_s"] = capture_s
        results.append(result)
    text = markdown(results, args)
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print(text)
    return results


if __name__ == "__main__":
    main()
