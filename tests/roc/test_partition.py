"""ROC's partitioner (peakcut.roc): the features of a hand-made edge list, split points by
binary search, the model fit recovering known coefficients, and the vertex-range rewrite at
the partitioner's edge offsets giving eager's numbers on the tiny GCN."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.roc.features import edge_features
from peakcut.roc.model import PartModel, fit_part_model, relative_errors
from peakcut.roc.partition import (
    balanced_edge_split,
    balanced_split,
    equal_edge_split,
    equal_vertex_split,
    split_points,
    vertex_split,
)
from peakcut.transform.vertex_ranges import edge_ranges, find_edge_chains, split_edge_chains
from peakcut.workloads import get_workload
from tests.tolerance import tolerance

# 5 vertices; v0 <- 1, 2, 4; v2 <- 0, 1; v3 <- 3 (grouped by destination, sources sorted)
DST = [0, 0, 0, 2, 2, 3]
SRC = [1, 2, 4, 0, 1, 3]


def _features():  # rows of 24 bytes, lines of 64: row s covers bytes [24 s, 24 s + 24)
    return edge_features(np.array(DST), np.array(SRC), 5, row_bytes=24, line_bytes=64)


def test_features_of_a_hand_made_edge_list() -> None:
    f = _features()
    # vertices, neighbours, runs of consecutive neighbours, lines touched ({1, 2}: lines 0-1; {4}: line 1; ...)
    assert f.vertex_features().tolist() == [[1, 3, 2, 3], [0, 0, 0, 0], [1, 2, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert f.part_features([0, 3, 6]).tolist() == [[1, 3, 2, 3], [2, 3, 2, 2]]
    # a part that starts inside v0's list and inside its run {1, 2} counts a vertex, a run and a whole row more
    assert f.part_features([0, 1, 6]).tolist() == [[1, 1, 1, 1], [3, 5, 4, 5]]
    assert f.vertex_offsets([0, 1, 2, 3, 5]).tolist() == [0, 3, 3, 5, 6]
    assert f.edge_rows().sum(axis=0).tolist() == [3, 6, 4, 5]
    with pytest.raises(ValueError, match="grouped by destination"):
        edge_features(np.array([1, 0]), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match="vertex ids"):
        edge_features(np.array([0, 5]), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match="offsets"):
        f.part_features([0, 7])


def test_split_points_by_binary_search() -> None:
    assert split_points(np.ones(8), 4).tolist() == [0, 2, 4, 6, 8]
    assert split_points(np.array([1.0, 1, 6, 1, 1]), 2).tolist() == [0, 2, 5]      # the nearer of 2 and 3
    assert split_points(np.ones(8), 2, first=2.0).tolist() == [0, 3, 8]             # 2 + 3 against 5
    f = _features()
    # v0 holds half the edges: balanced by neighbours, it is a part of its own
    split = balanced_split(f, f.vertex_features()[:, 1], 2)
    assert split.vertex_bounds.tolist() == [0, 1, 5] and split.offsets.tolist() == [0, 3, 6]
    # no part without an edge, even where the costs would leave one empty
    assert np.all(np.diff(balanced_split(f, np.array([0.0, 0, 0, 0, 1]), 3).offsets) > 0)
    assert balanced_edge_split(f, np.ones(6), 3).offsets.tolist() == [0, 2, 4, 6]
    assert equal_edge_split(f, 3).offsets.tolist() == [0, 2, 4, 6]
    assert equal_vertex_split(f, 2).vertex_bounds.tolist() == [0, 2, 5]
    assert vertex_split(f, np.array([0, 0, 5]), "moved").vertex_bounds.tolist() == [0, 1, 5]
    with pytest.raises(ValueError, match="parts"):
        balanced_split(f, np.ones(5), 7)
    with pytest.raises(ValueError, match="in-edge"):
        balanced_split(f, np.ones(5), 4)


def test_model_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 1000, size=(40, 4))
    first = np.arange(40) % 8 == 0
    truth = PartModel(("vertices", "neighbours", "runs", "accesses"), (2e-6, 5e-7, 0.0, 1e-7), 3e-5, 4e-5)
    seconds = truth.intercept + x @ np.array(truth.coefficients) + truth.first * first
    fitted = fit_part_model(x, seconds, first)
    assert fitted.coefficients == pytest.approx(truth.coefficients, rel=1e-6, abs=1e-15)
    assert (fitted.intercept, fitted.first) == pytest.approx((truth.intercept, truth.first), rel=1e-6)
    assert truth.split_seconds(x[:3]).tolist() == pytest.approx(seconds[:3].tolist())   # row 0: a first part
    # a negative dependence is fitted as none: the coefficients stay >= 0
    clipped = fit_part_model(x, 1e-3 - 1e-7 * x[:, 0] + 1e-6 * x[:, 1])
    assert min(clipped.coefficients) >= 0 and clipped.intercept >= 0
    assert relative_errors(np.array([1.1, 0.9]), np.array([1.0, 1.0])).tolist() == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="seconds"):
        fit_part_model(x, seconds[:-1])


def test_given_boundaries_keep_eager_numbers() -> None:
    """The tiny GCN split at the partitioner's vertex ranges (costs: in-degrees) gives eager's
    numbers; bad boundaries are refused naming them."""
    inst = get_workload("reddit-gcn").build("tiny")
    x, src, dst = inst.batch[:3]
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, peakcut.Adam(lr=1e-2), keep_grads=True)
    f = edge_features(dst.numpy(), src.numpy(), x.shape[0])
    split = balanced_split(f, f.vertex_features()[:, 1] + 1.0, 4)
    assert split.offsets.tolist() != list(edge_ranges(src.shape[0], 4))
    r, reasons = split_edge_chains(g, g.order, find_edge_chains(g), 4, boundaries=split.offsets.tolist())
    assert r is not None and reasons.count(None) == 4 and "given edge ranges" in r.description
    tol = tolerance(torch.float32, src.shape[0], 2)
    report = peakcut.check_equivalence(copy.deepcopy(inst.model), inst.batch, inst.loss_fn, peakcut.Adam(lr=1e-2),
                                       lambda _m: Step(r.graph, r.order), steps=2, rtol=tol, atol=tol)
    assert report.ok, report
    with pytest.raises(ValueError, match="boundaries"):
        split_edge_chains(g, g.order, find_edge_chains(g), 4, boundaries=[0, 5, 5, 9, src.shape[0]])
    with pytest.raises(ValueError, match="boundaries"):
        split_edge_chains(g, g.order, find_edge_chains(g), 3, boundaries=[0, 5, src.shape[0]])
    _, reasons = split_edge_chains(g, g.order, find_edge_chains(g), 2, boundaries=[0, 5, 10])
    assert all(r is not None for r in reasons) and any("boundaries end at 10" in str(r) for r in reasons)
