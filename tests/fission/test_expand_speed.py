"""The shortcuts of peakcut.fission.expand give exactly the unshortened result.

expand memoizes the FakeTensor run of a part node per call and input layouts (_memo_key) and
checks the expanded graph with one shape check per distinct call (_check_key); both only save
work. Expanding tiny ViT and BERT (two identical layers, parts of identical shapes: the memos
hit) with and without them must give identical graphs, and the memoized check must reject a
broken graph with check_graph's own message. No timing here (bench/ measures speed).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import pytest

import peakcut
from peakcut.fission.build import find_ftree
from peakcut.fission.expand import expand
from peakcut.fission.expanded import Expanded
from peakcut.fission.loss import detach_loss
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import GraphError
from peakcut.workloads import get_workload

expand_module = importlib.import_module("peakcut.fission.expand")  # the package exports expand()
infer_module = importlib.import_module("peakcut.ir.infer")


def _expand_root(name: str, *, check: bool = True) -> Expanded:
    inst = get_workload(name).build("tiny")
    g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    tree, dgraph = find_ftree(g, batch_only=True)
    root = tree.roots()[0]
    return expand(g, list(g.order), tree.with_n(root, 2), dgraph, check=check)


def _facts(ex: Expanded) -> dict[str, Any]:
    g = ex.graph
    return {"nodes": g.nodes, "tensors": g.tensors, "storages": g.storages, "control": g.control,
            "order": g.order, "inputs": g.inputs, "outputs": g.outputs,
            "input_names": g.input_names, "output_names": g.output_names, "device": g.device,
            "expanded_order": ex.order, "copies": dict(ex.copies), "regions": ex.regions}


@pytest.mark.parametrize("name", ["vit-base", "bert-base"])
def test_memoized_expansion_equals_unmemoized(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keys: list[Any] = []
    memo_key = infer_module.memo_key

    def recording(*args: Any) -> Any:
        key = memo_key(*args)
        keys.append(key)
        return key

    monkeypatch.setattr(infer_module, "memo_key", recording)
    memoized = _expand_root(name)
    hits = len([k for k in keys if k is not None]) - len({k for k in keys if k is not None})
    assert hits > len(keys) // 2, f"the memo hit {hits} of {len(keys)} calls"

    monkeypatch.setattr(infer_module, "memo_key", lambda *args: None)
    monkeypatch.setattr(expand_module, "_check_key", lambda *args: None)
    plain = _expand_root(name, check=False)
    assert _facts(memoized) == _facts(plain)
    for nid, node in memoized.graph.nodes.items():   # Node equality skips nothing that matters
        assert node.tags == plain.graph.nodes[nid].tags
        assert node.input_ids() == plain.graph.nodes[nid].input_ids()
    check_graph(memoized.graph)


def test_memoized_check_rejects_what_check_graph_rejects() -> None:
    ex = _expand_root("vit-base", check=False)
    g = ex.graph
    expand_module._check(g)   # sound
    # break the last part copy of a repeated call: its twins before it pass, it must not
    copies = [c for cs in ex.copies.values() if len(cs) > 1 for c in cs]
    victim = max(copies, key=ex.order.index)
    out = g.nodes[victim].output_ids()[0]
    meta = g.tensors[out]
    edit = GraphEditor(g)
    edit.set_tensor(replace(meta, dtype="float64" if meta.dtype != "float64" else "float32"))
    g = edit.finish()
    with pytest.raises(GraphError) as expected:
        check_graph(g)
    with pytest.raises(GraphError) as got:
        expand_module._check(g)
    assert str(got.value) == str(expected.value)
