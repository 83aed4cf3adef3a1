"""ROC's partitioner (peakcut.roc) on the GNN workloads: its cost model against measured part
times, and its split against equal vertex and equal edge ranges.

    python -m bench.roc_partition [workload ...] [--rounds R] [--out bench/roc_partition.md]

Measured, at medium size on this CPU: every sum over edges of the step (forward and backward,
each layer) is split into PARTS parts at TRAIN random vertex splits, and each part's ops are
timed as the split program runs them (bench.roc_timing: the thread's CPU time, one intra-op
thread, median of R rounds). Per layer, the model is fitted on those part times (a part's
time in a layer: its ops in every sum of that layer); the partitioner balances the summed
layers' predicted costs, over vertices (ROC's vertex ranges) and over edges (edge ranges).
Its two splits, the equal-vertex and the equal-edge splits are then timed the same way, in
the same rounds as the random splits again, whose times alone refit the model: the model's
error on the four held-out splits, and each split's latency with the parts side by side (ROC's setting, one device per part: per layer the slowest part, then
the layers one after another) and one after another on one device.

Simulated, at medium and paper size on the analytic H100 profile (capture order, no
workspace): the same four splits of the whole step, the partitioner's model fitted on the
profile's prices of the parts of TRAIN random splits. The profile prices a part by its
shapes, so a part's price is a function of its edge count; at paper size (a meta graph, no
values) the partition is over a degree sequence drawn as the workloads' graphs draw
destinations, and the features are the vertices and edges.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

import peakcut
from bench.roc_timing import part_programs, time_parts
from peakcut.cost import get_cost_model
from peakcut.cost.model import CostModel
from peakcut.ir.graph import Graph
from peakcut.roc.features import FEATURES, EdgeFeatures, edge_features
from peakcut.roc.model import PartModel, fit_part_model, relative_errors
from peakcut.roc.partition import (
    Split,
    balanced_edge_split,
    balanced_split,
    equal_edge_split,
    equal_vertex_split,
    split_points,
    vertex_split,
)
from peakcut.runtime import keep_freed_host_memory
from peakcut.simulate.timeline import simulate_timeline
from peakcut.transform.vertex_ranges import (
    GATHER,
    EdgeChain,
    VertexRangeTag,
    find_edge_chains,
    split_edge_chains,
)
from peakcut.transform.vertex_ranges import why_not_split as why_not
from peakcut.workloads import get_workload
from peakcut.workloads.graphs import PAPER_SHAPES

PARTS = 16
TRAIN = 8
SHAPE = 8.0
SEED = 0


@dataclass
class Step:
    """A captured GNN step: its graph, the chains that split (by layer) and the real index tensors."""

    name: str
    g: Graph
    layers: dict[str, list[EdgeChain]]
    batch: dict[int, torch.Tensor]
    src: torch.Tensor
    dst: torch.Tensor

    @property
    def vertices(self) -> int:
        return int(self.g.tensors[self.g.inputs[self.g.input_names.index("batch:0")]].shape[0])

    @property
    def edges(self) -> int:
        return int(self.src.shape[0])


def capture(name: str, size: str) -> Step:
    inst = get_workload(name).build(size)
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, peakcut.Adam(lr=1e-2))
    layers: dict[str, list[EdgeChain]] = defaultdict(list)
    for c in find_edge_chains(g):
        if why_not(g, c, PARTS) is None:
            layers[g.nodes[c.sink].module].append(c)
    batch = {t: inst.batch[int(n.split(":")[1])] for t, n in zip(g.inputs, g.input_names, strict=True)
             if n.startswith("batch:")}
    return Step(name, g, dict(layers), batch, inst.batch[1], inst.batch[2])


def row_bytes(g: Graph, chains: Sequence[EdgeChain]) -> int:
    """The widest row a layer's chains gather, in bytes."""
    widest = 1
    for c in chains:
        for v in c.nodes:
            if g.nodes[v].op == GATHER:
                meta = g.tensors[g.nodes[v].output_ids()[0]]
                widest = max(widest, meta.nbytes // max(meta.shape[0], 1))
    return widest


def random_bounds(vertices: int, count: int, seed: int) -> list[np.ndarray]:
    """`count` random vertex splits into PARTS ranges, their lengths drawn from Gamma(SHAPE) (from
    about a third of the mean to twice it): parts around the sizes the partitioner makes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        share = np.cumsum(rng.gamma(SHAPE, size=PARTS))
        out.append(np.concatenate([[0], np.round(share[:-1] / share[-1] * vertices), [vertices]]).astype(np.int64))
    return out


def random_splits(features: EdgeFeatures, count: int, seed: int) -> list[Split]:
    return [vertex_split(features, b, f"random {i}")
            for i, b in enumerate(random_bounds(features.vertices, count, seed))]


def compared_splits(features: EdgeFeatures, models: Sequence[tuple[PartModel, EdgeFeatures]]) -> list[Split]:
    """The partitioner's splits (vertex ranges, edge ranges) for the summed `models` (each on its
    layer's features), then equal vertices and equal edges."""
    vertex_cost = sum(m.costs(f.vertex_features()) for m, f in models)
    edge_cost = sum(m.costs(f.edge_rows()) for m, f in models)
    first = sum(m.first for m, _ in models)
    return [balanced_split(features, np.asarray(vertex_cost), PARTS, first, "partitioner, vertex ranges"),
            balanced_edge_split(features, np.asarray(edge_cost), PARTS, first),
            equal_vertex_split(features, PARTS), equal_edge_split(features, PARTS)]


# ------------------------------------------------------------------ measured on this CPU
def measure(step: Step, splits: Sequence[Split], rounds: int) -> list[dict[str, np.ndarray]]:
    """Per split, layer -> each part's measured seconds (its ops in every sum of the layer). The
    parts of all `splits` are timed in the same rounds, so load on the machine falls on all alike."""
    made: dict[object, torch.Tensor] = {}
    out: list[dict[str, np.ndarray]] = [{} for _ in splits]
    for layer, chains in step.layers.items():
        for i in range(len(splits)):
            out[i][layer] = np.zeros(splits[i].parts)
        for c in chains:
            programs = [part_programs(step.g, c, s.parts, s.offsets.tolist(), step.batch, made) for s in splits]
            times = time_parts([p for ps in programs for p in ps], rounds)
            at = 0
            for i, s in enumerate(splits):
                out[i][layer] += times[at:at + s.parts]
                at += s.parts
    return out


def fit_layers(step: Step, feats: dict[str, EdgeFeatures], splits: Sequence[Split],
               times: Sequence[dict[str, np.ndarray]]) -> dict[str, PartModel]:
    """Per layer, the model fitted on the parts of `splits` and their measured `times`."""
    firsts = np.concatenate([np.arange(s.parts) == 0 for s in splits])
    return {layer: fit_part_model(np.concatenate([feats[layer].part_features(s.offsets) for s in splits]),
                                  np.concatenate([t[layer] for t in times]), firsts)
            for layer in step.layers}


def latencies(per_layer: dict[str, np.ndarray]) -> tuple[float, float]:
    """(parts side by side: per layer the slowest part, summed; one after another: all parts)."""
    return (sum(float(t.max()) for t in per_layer.values()), sum(float(t.sum()) for t in per_layer.values()))


def measured_section(name: str, rounds: int) -> list[str]:
    """Fit on random splits, split, then time the random and the compared splits together and
    hold the compared ones out of the refit (module docstring)."""
    step = capture(name, "medium")
    feats = {layer: edge_features(step.dst.numpy(), step.src.numpy(), step.vertices, row_bytes=row_bytes(step.g, cs))
             for layer, cs in step.layers.items()}
    any_f = next(iter(feats.values()))
    t0 = time.perf_counter()
    train = random_splits(any_f, TRAIN, SEED)
    before = measure(step, train, rounds)
    chooser = fit_layers(step, feats, train, before)
    splits = compared_splits(any_f, [(m, feats[layer]) for layer, m in chooser.items()])
    times = measure(step, [*train, *splits], rounds)
    models = fit_layers(step, feats, train, times[:TRAIN])
    again = {layer: np.concatenate([relative_errors(b[layer], t[layer]) for b, t in zip(before, times, strict=False)])
             for layer in step.layers}
    lines = [f"### {name}, medium ({step.vertices:,} vertices, {step.edges:,} edges), {PARTS} parts: measured",
             "",
             f"Measured on {platform.processor() or platform.machine()}, torch {torch.__version__}, one intra-op "
             f"thread; a part's time is the thread's CPU time of its ops, median of {rounds} rounds. The "
             f"partitioner's split comes from a model fitted on the {TRAIN * PARTS} parts of {TRAIN} random vertex "
             "splits; those splits are then timed again in the same rounds as the four compared splits, and the "
             "model refitted on them alone predicts the compared splits' parts (held out):",
             ""]
    lines += [f"- {layer}: {m.describe()}" for layer, m in models.items()]
    lines += ["", "The same parts timed twice (the random splits' parts, before the fit and with the compared "
              "splits) differ by " + ", ".join(f"{layer} up to {d.max():.1%} (median {np.median(d):.1%})"
                                               for layer, d in again.items()) + ": the timing's own noise."]
    lines += ["", "| split | parts' edges (min-max) | largest error of a predicted part time, per layer | "
              "side by side, measured (predicted) | one device, measured (predicted) |", "|---|---|---|---|---|"]
    for split, measured in zip(splits, times[TRAIN:], strict=True):
        predicted = {layer: models[layer].split_seconds(feats[layer].part_features(split.offsets))
                     for layer in step.layers}
        errs = ", ".join(f"{layer} {relative_errors(predicted[layer], measured[layer]).max():.1%}"
                         for layer in step.layers)
        (ms, mq), (ps, pq) = latencies(measured), latencies(predicted)
        edges = np.diff(split.offsets)
        lines.append(f"| {split.name} | {edges.min():,}-{edges.max():,} | {errs} | {ms * 1e3:.2f} ms ({ps * 1e3:.2f}) "
                     f"| {mq * 1e3:.2f} ms ({pq * 1e3:.2f}) |")
    lines += ["", f"({time.perf_counter() - t0:.0f} s of timing.)", ""]
    return lines


# ------------------------------------------------------------------ simulated on a profile
def part_prices(g: Graph, chains: Sequence[EdgeChain], offsets: Sequence[int], cost: CostModel,
                named_rows: dict[int, list[int]]) -> np.ndarray:
    """[chain, part] device seconds of each part's nodes on `cost` (the sums over the
    destination index priced at the vertices each part adds into: named_rows)."""
    prices = np.zeros((len(chains), len(offsets) - 1))
    for i, c in enumerate(chains):
        index = g.nodes[c.sink].args[2].id
        mine = {t: rows for t, rows in named_rows.items() if t == index}
        r, reasons = split_edge_chains(g, g.order, [c], len(offsets) - 1, boundaries=offsets, named_rows=mine)
        if r is None:
            raise ValueError(f"chain {g.nodes[c.sink].name}: {reasons[0]}")
        for v in r.added:
            tag = r.graph.nodes[v].tags.get(VertexRangeTag)
            if tag is not None:
                prices[i, tag.part] += cost.node_seconds(r.graph, v)
    return prices


def simulated_rows(step: Step, part_features: Callable[[Split], np.ndarray],
                   splits_for: Callable[[PartModel | str], list[Split]], names: Sequence[str],
                   cost: CostModel) -> list[str]:
    """The four splits of the step priced on `cost` (module docstring). Feature 0 of
    part_features is the destination vertices a part adds into: the rows its sums over the
    destination index name."""
    g = step.g
    chains = [c for cs in step.layers.values() for c in cs]
    dst = g.inputs[g.input_names.index("batch:2")]

    def named(split: Split) -> dict[int, list[int]]:
        return {dst: [max(1, int(v)) for v in part_features(split)[:, 0]]}

    xs, ys, firsts = [], [], []
    for split in splits_for("random"):
        prices = part_prices(g, chains, split.offsets.tolist(), cost, named(split)).sum(axis=0)
        xs.append(part_features(split))
        ys.append(prices)
        firsts.append(np.arange(split.parts) == 0)
    model: PartModel = fit_part_model(np.concatenate(xs), np.concatenate(ys), np.concatenate(firsts), names)
    rows = [f"Fitted on the profile's part prices: {model.describe()}.", "",
            "| split | parts' edges (min-max) | largest error of a predicted part price | step, one device | "
            "step, parts side by side | slowest part / mean part |", "|---|---|---|---|---|---|"]
    for split in splits_for(model):
        r, _ = split_edge_chains(g, g.order, chains, split.parts, boundaries=split.offsets.tolist(),
                                 named_rows=named(split))
        if r is None:
            raise ValueError(f"{split.name}: the step does not split")
        one = simulate_timeline(r.graph, r.order, cost, workspace=None).latency_seconds
        prices = part_prices(g, chains, split.offsets.tolist(), cost, named(split))
        side = one - float((prices.sum(axis=1) - prices.max(axis=1)).sum())
        per_part = prices.sum(axis=0)
        error = relative_errors(model.split_seconds(part_features(split)), per_part).max()
        edges = np.diff(split.offsets)
        rows.append(f"| {split.name} | {edges.min():,}-{edges.max():,} | {error:.1%} | {one * 1e3:.3f} ms | "
                    f"{side * 1e3:.3f} ms | {per_part.max() / per_part.mean():.3f} |")
    return rows


def simulated_medium(name: str, profile: str) -> list[str]:
    step = capture(name, "medium")
    feats = edge_features(step.dst.numpy(), step.src.numpy(), step.vertices,
                          row_bytes=max(row_bytes(step.g, cs) for cs in step.layers.values()))
    cost = get_cost_model(profile)

    def splits_for(model: PartModel | str) -> list[Split]:
        if isinstance(model, str):
            return random_splits(feats, TRAIN, SEED + 1)
        return compared_splits(feats, [(model, feats)])

    head = [f"### {name}, medium, {PARTS} parts: simulated on the analytic {profile} profile", ""]
    return head + simulated_rows(step, lambda s: feats.part_features(s.offsets), splits_for, FEATURES, cost) + [""]


def paper_degrees(name: str, seed: int) -> np.ndarray:
    """A destination degree sequence of the paper graph's shape, drawn as graphs.py draws
    destinations (rank ** -0.8 over a random ranking)."""
    shape = PAPER_SHAPES[name.split("-")[0]]
    rng = np.random.default_rng(seed)
    weights = np.arange(1, shape.vertices + 1, dtype=np.float64) ** -0.8
    counts = rng.multinomial(shape.edges, weights / weights.sum())
    return counts[rng.permutation(shape.vertices)].astype(np.int64)


def simulated_paper(name: str, profile: str) -> list[str]:
    step = capture(name, "paper")
    degrees = paper_degrees(name, SEED)
    if int(degrees.sum()) != step.edges:
        raise ValueError(f"{name}: {degrees.sum()} edges drawn, the step has {step.edges}")
    vf = np.stack([(degrees > 0).astype(np.float64), degrees.astype(np.float64)], axis=1)
    ends = np.concatenate([[0], np.cumsum(degrees)])
    cost = get_cost_model(profile)
    v = step.vertices

    def split_at(bounds: np.ndarray, label: str) -> Split:
        bounds = np.asarray(bounds, dtype=np.int64)
        return Split(label, bounds, ends[bounds].astype(np.int64))

    def splits_for(model: PartModel | str) -> list[Split]:
        if isinstance(model, str):
            return [split_at(b, f"random {i}") for i, b in enumerate(random_bounds(v, TRAIN, SEED + 1))]
        edge_cost = np.repeat(model.costs(vf) / np.maximum(degrees, 1), degrees)
        return [split_at(split_points(model.costs(vf), PARTS, model.first), "partitioner, vertex ranges"),
                Split("partitioner, edge ranges", None, split_points(edge_cost, PARTS, model.first)),
                split_at(np.array([k * v // PARTS for k in range(PARTS + 1)]), "equal vertices"),
                Split("equal edges", None, np.array([k * step.edges // PARTS for k in range(PARTS + 1)]))]

    bearing = np.concatenate([[0], np.cumsum(degrees > 0)])

    def part_features(split: Split) -> np.ndarray:
        """(vertices with an edge in the part, edges) of each part of an edge range split."""
        lo, hi = split.offsets[:-1], split.offsets[1:]
        first_v = np.searchsorted(ends, lo, side="right") - 1        # the vertex of the part's first edge
        last_v = np.searchsorted(ends, hi - 1, side="right") - 1
        return np.stack([bearing[last_v + 1] - bearing[first_v], hi - lo], axis=1).astype(np.float64)

    head = [f"### {name}, paper ({v:,} vertices, {step.edges:,} edges), {PARTS} parts: simulated on the "
            f"analytic {profile} profile", ""]
    return head + simulated_rows(step, part_features, splits_for, ("vertices", "neighbours"), cost) + [""]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=["reddit-gcn"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--out", default=None)
    ap.add_argument("--simulated-only", action="store_true", help="no measured sections (they time for minutes)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_host_memory()         # as a plan runs: no page faults on memory malloc has had
    lines = ["## ROC's partitioner: predicted and measured part times, and the splits compared", ""]
    for name in args.workloads:
        if not args.simulated_only:
            lines += measured_section(name, args.rounds)
        lines += simulated_medium(name, args.profile)
    lines += simulated_paper("reddit-gcn", args.profile)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
