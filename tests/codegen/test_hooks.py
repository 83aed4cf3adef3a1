"""Code hooks: codegen finds the code of the nodes transformations add by the graph's ops and
tags, never through the rule registry, and a caller's own hook reaches the generated step."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import torch

import peakcut
from peakcut.codegen.builtin_code import BUILTIN_HOOKS
from peakcut.codegen.hooks import CodeHook, Names, NodeCode
from peakcut.codegen.recompute_code import RecomputeHook
from peakcut.codegen.source import generate_source
from peakcut.codegen.swap_code import SwapHook
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.rules import RULES
from tests.conftest import SmallCNN, cnn_loss

CODEGEN = Path(peakcut.__file__).parent / "codegen"


def _graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "sgd")


def _with_swap_and_remat() -> tuple[Graph, list[int]]:
    g = _graph()
    (s,) = RULES.hotspot_candidates(g, g.order, limit=1, kinds=("swap",))
    rw = s.apply(g, g.order)
    (r,) = RULES.hotspot_candidates(rw.graph, rw.order, limit=1, kinds=("remat",))
    rw = r.apply(rw.graph, rw.order)
    return rw.graph, rw.order


class _FakeNames:
    by_tensor: dict[int, str] = {}

    def fresh(self, text: str) -> str:
        return text


def test_the_built_in_hooks_find_their_nodes_by_the_graph() -> None:
    g, order = _with_swap_and_remat()
    plain = _graph()
    assert [h.code(plain, plain.order, _FakeNames()) for h in BUILTIN_HOOKS] == [None] * len(BUILTIN_HOOKS)
    found = [type(h) for h in BUILTIN_HOOKS if h.code(g, order, _FakeNames()) is not None]
    assert found == [SwapHook, RecomputeHook]
    assert {n for h in BUILTIN_HOOKS for n in h.reserved_names} == {"host", "compute", "d2h", "h2d", "host_ops"}
    source = generate_source(g, order)
    assert "# recompute of " in source and "host.empty_strided(" in source and ", host):" in source


class _Traced(NodeCode):
    def __init__(self, g: Graph, names: Names) -> None:
        self.g, self.names = g, names

    def signature_extra(self) -> str:
        return ", trace"

    def prologue(self) -> list[str]:
        return ["    traced = []"]

    def emit(self, node: Node) -> list[str] | None:
        if node.op != "aten.relu.default":
            return None
        (x,) = node.input_ids()
        (y,) = node.output_ids()
        return [f"    {self.names.by_tensor[y]} = aten.relu.default({self.names.by_tensor[x]})",
                f"    trace({self.names.by_tensor[y]!r})"]


class _TraceHook(CodeHook):
    reserved_names = ("traced",)

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        return _Traced(g, names)


def test_a_callers_hook_writes_its_nodes_and_keeps_its_names_free() -> None:
    g = _graph()
    source = generate_source(g, extra=(_TraceHook(),))
    assert ", trace):" in source and "    traced = []" in source
    assert source.count("trace(") == sum(n.op == "aten.relu.default" for n in g.nodes.values())
    assert "traced =" not in generate_source(g)
    compile(source, "<generated>", "exec")


def test_codegen_imports_no_rule() -> None:
    for path in sorted(CODEGEN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("peakcut.rules"), path.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("peakcut.rules") for a in node.names), path.name
