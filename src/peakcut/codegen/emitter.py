"""The lines of the generated step's body: each node's call, loops of fission regions, the
`del` after each last use, and each input bound to a local right before its first use.

Node code of hooks (codegen.hooks) is written for the top level of the body and indented here
to where the node runs (a node outside every region inside a loop, under `if part == k:`).
With a placement (codegen.arena), a node it places gets its results as views into the arena
and is called through its out overload; inside a loop body, each iteration's view where they
differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peakcut.codegen.arena import Placement, view_source
from peakcut.codegen.calls import argument_sources, call_source, literal
from peakcut.codegen.fission import Item, Loop, LoopPlan, Unrolled
from peakcut.codegen.hooks import Names, NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.ops import GATE_OP

PAD = "    "


class Emitter:
    """Lines of the step's body for one program.

    inputs: program input tensor -> the source that reads it from the step's mappings (bound
    to its local right before its first use; the ones the step returns, at the top).
    placement: the arena's placements (None: every result allocated by its op); `placed`
    collects the nodes whose results went into the arena."""

    def __init__(self, g: Graph, names: Names, frees: Mapping[int, list[int]], codes: Sequence[NodeCode],
                 plan: LoopPlan | None, inputs: Mapping[int, str], placement: Placement | None = None) -> None:
        self.g = g
        self.names = names
        self.frees = frees
        self.codes = codes
        self.plan = plan
        self.section: tuple[str, str] | None = None
        self.unbound = dict(inputs)
        self.placement = placement
        self.placed: set[int] = set()
        self._kept: set[int] | None = None      # storages of tensors some code keeps past their last use

    def bind(self, tensors: Sequence[int], pad: str) -> list[str]:
        """Lines binding those of `tensors` that are inputs not bound yet."""
        lines = []
        for t in tensors:
            source = self.unbound.pop(t, None)
            if source is not None:
                lines.append(f"{pad}{self.names.by_tensor[t]} = {source}")
        return lines

    def items(self, items: Sequence[Item] | Sequence[int], depth: int) -> list[str]:
        lines: list[str] = []
        pad = PAD * depth
        for it in items:
            if isinstance(it, Loop):
                self.section = None
                lines.extend(self.bind(_reads(self.g, it), pad))
                lines.append(pad + it.comment)
                lines.append(f"{pad}for {it.var} in range({it.n}):")
                lines.extend(self._body(it, depth + 1))
                self.section = None
            elif isinstance(it, Unrolled):
                self.section = None
                lines.append(f"{pad}# fission region {it.fnode} ({it.n} parts) emitted unrolled: "
                             f"{it.reason}")
                lines.extend(self.items(it.items, depth))
                self.section = None
            else:
                lines.extend(self.node(it, depth))
        return lines

    def _body(self, loop: Loop, depth: int) -> list[str]:
        """The loop's body: part 0's items, and the nodes outside the region where they run."""
        at: dict[int, dict[int, list[int]]] = {}
        for position, k, nid in loop.guarded:
            at.setdefault(position, {}).setdefault(k, []).append(nid)
        lines: list[str] = []
        body = loop.parts[0]
        for position in range(len(body) + 1):
            for k, nodes in sorted(at.get(position, {}).items()):
                lines.append(f"{PAD * depth}if {loop.var} == {k}:  # outside the region, run in part {k}")
                self.section = None
                for nid in nodes:
                    lines.extend(self.node(nid, depth + 1, bind=True))
                self.section = None
            if position < len(body):
                lines.extend(self.items([body[position]], depth))
        return lines

    def _dels(self, nid: int) -> list[tuple[str, list[int]]]:
        if self.plan is not None:
            groups = self.plan.dels.get(nid, [])
        else:
            groups = [("", self.frees.get(nid, []))]
        codes = self.codes
        out = []
        for cond, tensors in groups:
            kept = [t for t in tensors if not any(c.keeps(t) for c in codes)] if codes else tensors
            if kept:
                out.append((cond, kept))
        return out

    def _del_lines(self, nid: int, pad: str) -> list[str]:
        lines = []
        for cond, tensors in self._dels(nid):
            names = ", ".join(self.names.by_tensor[t] for t in tensors)
            if cond:
                lines.append(f"{pad}if {cond}:")
                lines.append(f"{pad}    del {names}")
            else:
                lines.append(f"{pad}del {names}")
        return lines

    def _before(self, nid: int, pad: str) -> list[str]:
        """The hooks' lines before node nid; in a loop body, those of every node it stands for,
        each under its iteration's condition where they differ in more than comments."""
        own = [line for code in self.codes for line in code.before(nid, pad)]
        others = self.plan.counterparts.get(nid, []) if self.plan is not None else []
        if len(others) <= 1:
            return own
        each = [(cond, [line for code in self.codes for line in code.before(y, pad + PAD)])
                for cond, y in others]
        if not any(_statements(lines) for _, lines in each) or all(lines == each[0][1] for _, lines in each):
            return own
        out: list[str] = []
        for cond, lines in each:
            if _statements(lines):
                out.extend([f"{pad}if {cond}:", *lines])
        return out

    def node(self, nid: int, depth: int, bind: bool = False) -> list[str]:
        """Node nid's lines at `depth`; bind: bind the inputs it reads first (at the top level
        and where a loop runs a node outside its region, once)."""
        g, names = self.g, self.names
        pad = PAD * depth
        node = g.nodes[nid]
        lines: list[str] = []
        where = (node.phase.value, node.module)
        if where != self.section:
            self.section = where
            lines.append(f"{pad}# -- {node.phase.value}{': ' + node.module if node.module else ''}")
        if bind or depth == 1:
            lines.extend(self.bind(node.input_ids(), pad))
        lines.extend(self._before(nid, pad))
        for code in self.codes:
            own = code.emit(node)
            if own is not None:
                indent = PAD * (depth - 1)
                return lines + [indent + line for line in own] + self._del_lines(nid, pad)
        if node.op == GATE_OP:
            found_inf = literal(node.args[0], names.by_tensor, g.device)
            returned = ", ".join(names.by_tensor[t] for t in g.outputs)
            lines.append(f"{pad}if {found_inf}.item():  # GradScaler: a gradient is inf or nan, the update is skipped")
            lines.append(f"{pad}    return ({returned}{',' if len(g.outputs) == 1 else ''})")
            return lines + self._del_lines(nid, pad)
        outs = [names.by_tensor[t] if t is not None else "_" for t in node.outputs]
        override = None
        if self.plan is not None and nid in self.plan.slices:
            start, end = self.plan.slices[nid]
            override = {2: start, 3: end}
        views = self._views(nid)
        if views is not None:
            variant = self.placement.outs[nid]  # type: ignore[union-attr]
            for name, view in zip(outs, views, strict=True):
                lines.append(f"{pad}{name} = {view}  # placed in the arena")
            args = argument_sources(node, names.by_tensor, g.device, override)
            if variant.method:
                value = args[variant.arg] if isinstance(variant.arg, int) else variant.arg or ""
                lines.append(f"{pad}{outs[0]}.{variant.method}({value})")
            else:
                given = [f"{key}={name}" for key, name in zip(variant.names, outs, strict=True)]
                lines.append(f"{pad}{variant.target}({', '.join([*args, *given])})")
            self.placed.add(nid)
            if self.plan is not None:       # and the nodes it stands for in the other iterations
                self.placed.update(y for _, y in self.plan.counterparts.get(nid, []))
            return lines + self._del_lines(nid, pad)
        call = call_source(node, names.by_tensor, g.device, override)
        if node.multi_output:
            target = ", ".join(outs) + ("," if len(outs) == 1 else "")
            lines.append(f"{pad}{target} = {call}")
            if None in node.outputs:
                lines.append(f"{pad}del _")
        else:
            lines.append(f"{pad}{outs[0]} = {call}")
        return lines + self._del_lines(nid, pad)

    def _views(self, nid: int) -> list[str] | None:
        """The source of each result of node nid as a view into the arena, or None when the
        placement does not place it; in a loop body, a conditional expression over the
        iterations whose views differ (every node the body's node stands for is placed, or none)."""
        placement = self.placement
        if placement is None or nid not in placement.outs:
            return None
        others = self.plan.counterparts.get(nid, []) if self.plan is not None else []
        conds = [cond for cond, _ in others] if len(others) > 1 else [""]
        views = [self._own_views(y) for _, y in others] if len(others) > 1 else [self._own_views(nid)]
        each = [v for v in views if v is not None]
        if len(each) < len(views):
            return None
        found: list[str] = []
        for sources in zip(*each, strict=True):
            if all(src == sources[0] for src in sources):
                found.append(sources[0])
            else:
                chain = " else ".join(f"{src} if {cond}" for cond, src in zip(conds[:-1], sources[:-1], strict=True))
                found.append(f"({chain} else {sources[-1]})")
        return found

    def _own_views(self, nid: int) -> list[str] | None:
        """Node nid's results as arena views (None: some result is not placed, or code keeps it)."""
        placement = self.placement
        node = self.g.nodes[nid]
        if placement is None or nid not in placement.outs or None in node.outputs:
            return None
        if self._kept is None:
            self._kept = {m.storage for t, m in self.g.tensors.items() if any(c.keeps(t) for c in self.codes)}
        views = []
        for t in node.outputs:
            meta = self.g.tensors[t]  # type: ignore[index]
            offset = placement.offsets.get(meta.storage)
            if offset is None or meta.storage in self._kept:
                return None
            views.append(view_source(meta, offset, self.g.storages[meta.storage]))
        return views


def _statements(lines: Sequence[str]) -> bool:
    return any(not line.lstrip().startswith("#") for line in lines)


def _reads(g: Graph, loop: Loop) -> list[int]:
    """The tensors the nodes of the loop's parts read (those outside it that it runs bind
    what they read first where they run)."""
    out: list[int] = []

    def walk(items: Sequence[Item]) -> None:
        for it in items:
            if isinstance(it, int):
                out.extend(g.nodes[it].input_ids())
            elif isinstance(it, Loop):
                for part in it.parts:
                    walk(part)
            else:
                walk(it.items)

    walk([loop])
    return out
