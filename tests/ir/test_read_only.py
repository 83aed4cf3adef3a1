"""Graphs are changed only through peakcut.ir.edit.GraphEditor outside peakcut.ir.

At run time a graph's mappings are read-only views and its attributes cannot be assigned
(tests/ir/test_graph.py); what that cannot catch, changing one of its lists in place
(g.order.append(...)), is searched for here in the source of every module outside peakcut.ir.
"""

from __future__ import annotations

import ast
from pathlib import Path

import peakcut

LISTS = ("order", "inputs", "outputs", "input_names", "output_names")
MAPPINGS = ("tensors", "nodes", "storages", "control")
MUTATORS = ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse", "update",
            "setdefault", "popitem", "__setitem__", "__delitem__")


def _graph_field(node: ast.AST, fields: tuple[str, ...]) -> bool:
    """`<x>.<field>` for one of `fields`, x not `self` (other classes' own attributes)."""
    return (isinstance(node, ast.Attribute) and node.attr in fields
            and not (isinstance(node.value, ast.Name) and node.value.id == "self"))


def writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of every in-place change of a graph's list or mapping in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS and _graph_field(node.func.value, LISTS + MAPPINGS):
            found.append(node)
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            item = isinstance(target, ast.Subscript) and _graph_field(target.value, LISTS + MAPPINGS)
            extended = isinstance(node, ast.AugAssign) and _graph_field(target, LISTS)
            if item or extended:
                found.append(target)
    return sorted((n.lineno, ast.unparse(n)) for n in found)


def test_no_module_outside_ir_changes_a_graph_in_place():
    root = Path(peakcut.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "ir":
            continue
        found += [f"{path.relative_to(root)}:{line}: {text}"
                  for line, text in writes(ast.parse(path.read_text()))]
    assert not found, "edit graphs through peakcut.ir.edit.GraphEditor:\n" + "\n".join(found)


def test_the_search_finds_each_kind_of_write():
    source = """
g.order.append(3)
h.outputs += [4]
g.nodes[3] = node
del g.storages[5]
g.control.pop(2, None)
self.order.append(3)
x = g.order[0]
"""
    assert [line for line, _ in writes(ast.parse(source))] == [2, 3, 4, 5, 6]
