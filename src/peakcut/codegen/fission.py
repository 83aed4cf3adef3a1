"""Loops for fissioned graphs: the plan that turns an expanded graph's parts back into loops.

peakcut.fission.expand unrolls every fission region into n parts and tags the nodes
(peakcut.ir.tags.FissionTag: region, role, part, path, n). Here the order of such a graph is read back
as nested structure: a region's parts become one `for part in range(n):` loop whose body is
part 0's nodes (nested regions give nested loops, `part2`, `part3`, ...). The program then
runs exactly the expanded order, so it allocates and frees in the sequence the simulator
assumes:

- a slice of part k starts at k * step: the body writes `part * step`;
- a tensor made inside the body is deleted at its last use in the body, so nothing made by
  one part survives into the next;
- a tensor made outside the loop whose last use is inside it (the whole tensor a part
  slices, a shared input) is deleted in the body, at that use, in the last part only
  (`if part == n - 1: del x`): that is where the expanded order frees it.

A region becomes a loop only when the plan can prove the loop runs the expanded order: all
its nodes run in one stretch, part after part; every part is the same as part 0 up to its
own tensors and the slice offsets; every tensor a part makes is read in that part only; and
every part frees the same tensors. Nodes outside every region that the order runs inside an
outermost region's stretch (a parameter's copy brought in right before its first reader, say)
stay where they run: in the body, under `if part == k:` for the part they run in. Otherwise
(or when the caller refuses it, e.g. for swap code) the region is emitted unrolled, under a
comment saying why; regions nested in it can still be loops.

    plan = plan_loops(g, order, last_uses(g, order))    # what codegen.source emits
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tags import FissionTag, Path


def has_fission(g: Graph) -> bool:
    """True when some node comes from a fission expansion."""
    return any(n.tags.get(FissionTag) is not None for n in g.nodes.values())


def _path(node: Node) -> Path:
    tag = node.tags.get(FissionTag)
    return tag.path if tag is not None else ()


def _role(node: Node) -> str | None:
    tag = node.tags.get(FissionTag)
    return tag.role if tag is not None else None


@dataclass(eq=False)
class Loop:
    """A region emitted as `for <var> in range(n):` over `parts` (part 0's items are the body)."""

    fnode: int
    n: int
    depth: int                         # 1 for an outermost loop
    parts: list[list[Item]]
    key: tuple[int, Path] | tuple[()] = ()   # (fnode, enclosing path): the region instance
    var: str = ""
    comment: str = ""
    guarded: list[tuple[int, int, int]] = field(default_factory=list)
    """(body position, part, node): a node outside the region that runs in part `part`, right
    before the body's item at `position` (len(body) = after the last); outermost loops only."""


@dataclass(eq=False)
class Unrolled:
    """A region emitted part after part, under a comment saying why it is not a loop."""

    fnode: int
    n: int
    reason: str
    items: list[Item]


Item = int | Loop | Unrolled


@dataclass
class LoopPlan:
    """How to emit an order with loops.

    items: the top-level items. display: preferred names of the tensors the loop bodies
    use (part 0's, without their part suffix). slices: slice node -> (start, end) source
    expressions. dels: emitted node -> [(condition source, tensors to delete)], with
    condition "" for an unconditional del.
    """

    items: list[Item]
    display: dict[int, str] = field(default_factory=dict)
    slices: dict[int, tuple[str, str]] = field(default_factory=dict)
    dels: dict[int, list[tuple[str, list[int]]]] = field(default_factory=dict)
    canonical: dict[int, int] = field(default_factory=dict)   # tensor -> the body's tensor
    same_as: dict[int, int] = field(default_factory=dict)     # node -> the body's node
    counterparts: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    """Body node -> (condition source, node) for each node it stands for in some iteration
    (itself: the iteration of part 0)."""


class _NotALoop(Exception):
    """A loop would not run the order exactly: its region is emitted unrolled instead."""

    def __init__(self, reason: str, key: tuple[int, Path] | tuple[()] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


def plan_loops(g: Graph, order: Sequence[int], frees: Mapping[int, list[int]],
               refuse: Callable[[list[int]], str | None] | None = None) -> LoopPlan:
    """The loop structure of `order` on an expanded graph.

    frees: node -> tensors the expanded order frees right after it (codegen.source.last_uses).
    refuse(nodes): a reason not to emit a region with these nodes as a loop, or None.
    """
    unrolled: dict[tuple[int, Path] | tuple[()], str] = {}   # (fnode, enclosing path) -> reason
    sizes: dict[tuple[int, tuple], int] = {}      # (fnode, enclosing path) -> its node count
    for nid in order:
        path = _path(g.nodes[nid])
        for d in range(len(path)):
            key = (path[d][0], path[:d])
            sizes[key] = sizes.get(key, 0) + 1
    for _ in range(len(g.nodes) + 1):
        items = _group(g, list(order), 0, unrolled, refuse, sizes)
        _name_loops(g, items, 0)
        plan = LoopPlan(items)
        try:
            _canonicalize(g, items, plan)
            _plan_dels(g, items, frees, plan)
        except _NotALoop as e:
            unrolled[e.key] = e.reason
            continue
        _display_names(g, plan)
        return plan
    raise RuntimeError("internal: loop planning did not settle")   # one region per round


# ------------------------------------------------------------------ structure
def _group(g: Graph, nodes: list[int], depth: int, unrolled: Mapping[tuple[int, Path] | tuple[()], str],
           refuse: Callable[[list[int]], str | None] | None,
           sizes: Mapping[tuple[int, tuple], int]) -> list[Item]:
    """Items of a contiguous run of nodes, all inside `depth` enclosing regions."""
    items: list[Item] = []
    i = 0
    while i < len(nodes):
        path = _path(g.nodes[nodes[i]])
        if len(path) <= depth:
            items.append(nodes[i])
            i += 1
            continue
        fid, outer = path[depth][0], path[:depth]
        j = i
        end = _last_of(g, nodes, i, fid) if depth == 0 else i
        while j < len(nodes) and (_in_region(_path(g.nodes[nodes[j]]), outer, fid)
                                  or (j < end and not _path(g.nodes[nodes[j]]))):
            j += 1
        run = nodes[i:j]
        i = j
        own = [nid for nid in run if _path(g.nodes[nid])]     # the others: outside every region
        n = next((tag.n for nid in run if (tag := g.nodes[nid].tags.get(FissionTag)) is not None
                  and tag.region == fid and tag.n is not None), 0)
        reason = unrolled.get((fid, outer))
        if reason is None and len(own) != sizes[(fid, outer)]:
            reason = (f"its nodes do not run in one stretch in this order ({len(own)} of "
                      f"{sizes[(fid, outer)]} here)")
        parts: list[list[int]] = []
        guarded: list[tuple[int, int, int]] = []     # (position among its part's nodes, part, node)
        if reason is None:
            reason = refuse(own) if refuse is not None else None
        if reason is None:
            for nid in run:
                if not _path(g.nodes[nid]):
                    guarded.append((len(parts[-1]), len(parts) - 1, nid))
                    continue
                k = _path(g.nodes[nid])[depth][1]
                if k == len(parts) - 1:
                    parts[-1].append(nid)
                elif k == len(parts):
                    parts.append([nid])
                else:
                    reason = (f"its parts are interleaved in this order (part {k} after part "
                              f"{len(parts) - 1})" if parts else
                              f"its first node in this order belongs to part {k}")
                    break
            if reason is None and len(parts) != n:
                reason = f"{len(parts)} of its {n} parts run here"
        loop = None
        if reason is None:
            loop = Loop(fid, n, depth + 1, [_group(g, p, depth + 1, unrolled, refuse, sizes) for p in parts],
                        key=(fid, outer))
            reason = _place_guarded(loop, guarded)
        if loop is not None and reason is None:
            items.append(loop)
        else:
            items.append(Unrolled(fid, n, reason or "",
                                  _group(g, run, depth + 1, unrolled, refuse, sizes)))
    return items


def _last_of(g: Graph, nodes: list[int], start: int, fid: int) -> int:
    """The index in `nodes` of the last node of outermost region `fid` from `start` on, while
    only nodes outside every region come between its nodes."""
    last = start
    for j in range(start, len(nodes)):
        path = _path(g.nodes[nodes[j]])
        if path and path[0][0] != fid:
            break
        if path:
            last = j
    return last


def _place_guarded(loop: Loop, guarded: list[tuple[int, int, int]]) -> str | None:
    """Loop.guarded from (position among part k's nodes, part k, node); why not when a node
    would run inside a nested region of the body."""
    for at, k, nid in guarded:
        count, position = 0, 0
        for item in loop.parts[k]:
            if count >= at:
                break
            count += len(_nodes([item]))
            position += 1
        if count != at:
            return f"node {nid}, outside every region, runs inside a region nested in it"
        loop.guarded.append((position, k, nid))
    return None


def _in_region(path: tuple[tuple[int, int], ...], outer: tuple[tuple[int, int], ...],
               fid: int) -> bool:
    """True when a node with this path belongs to the instance of region `fid` inside `outer`."""
    depth = len(outer)
    return len(path) > depth and path[:depth] == outer and path[depth][0] == fid


def _name_loops(g: Graph, items: list[Item], depth: int) -> None:
    """Loop variables (part, part2, ...) by loop depth, and each loop's comment line."""
    for it in items:
        if isinstance(it, Loop):
            it.var = "part" if it.depth == 1 else f"part{it.depth}"
            it.comment = _describe(g, it)
            for p in it.parts:
                _name_loops(g, p, depth + 1)
        elif isinstance(it, Unrolled):
            _name_loops(g, it.items, depth)


def _describe(g: Graph, loop: Loop) -> str:
    """'# fission region 3: 41 ops in layer1, ..., layer2 (D-Graph dimension 0), 4 parts'."""
    body = _nodes(loop.parts[0])
    tags = {nid: tag for nid in body if (tag := g.nodes[nid].tags.get(FissionTag)) is not None
            and tag.of is not None}
    own = [nid for nid, tag in tags.items() if tag.region == loop.fnode]
    copies = list(dict.fromkeys(tag.of for tag in tags.values()))
    components = sorted({"?" if tags[nid].component is None else str(tags[nid].component)
                         for nid in own})
    modules = list(dict.fromkeys(g.nodes[nid].module for nid in tags if g.nodes[nid].module))
    where = ""
    if modules:
        shown = modules if len(modules) <= 3 else [modules[0], "...", modules[-1]]
        where = f" in {', '.join(shown)}"
    outside = f"; {len(loop.guarded)} ops outside it run in their part" if loop.guarded else ""
    return (f"# fission region {loop.fnode}: {len(copies)} ops{where}, split along D-Graph "
            f"dimension {'/'.join(components)} into {loop.n} parts{outside}")


def _nodes(items: list[Item]) -> list[int]:
    """Every node of the items, in order (all parts of loops)."""
    out: list[int] = []
    for it in items:
        if isinstance(it, int):
            out.append(it)
        elif isinstance(it, Loop):
            for p in it.parts:
                out.extend(_nodes(p))
        else:
            out.extend(_nodes(it.items))
    return out


# ------------------------------------------------------------------ parts are alike
def _canonicalize(g: Graph, items: list[Item], plan: LoopPlan) -> None:
    """Map every part's nodes and tensors to part 0's; _NotALoop (naming the region) when a
    part differs."""
    for it in items:
        if isinstance(it, Unrolled):
            _canonicalize(g, it.items, plan)
        elif isinstance(it, Loop):
            for p in it.parts:
                _canonicalize(g, p, plan)
            for k in range(1, it.n):
                try:
                    _match(g, it.parts[k], it.parts[0], it, k, plan)
                except _NotALoop as e:
                    raise _NotALoop(f"part {k} differs from part 0: {e.reason}", it.key) from None
            _slice_exprs(g, it, plan)


def _canon(plan: LoopPlan, t: int) -> int:
    return plan.canonical.get(t, t)


def _match(g: Graph, ys: list[Item], xs: list[Item], loop: Loop, k: int, plan: LoopPlan) -> None:
    """Part k's items `ys` against part 0's `xs` (nested loops: part by part)."""
    if len(ys) != len(xs):
        raise _NotALoop(f"{len(ys)} items against {len(xs)}")
    for y, x in zip(ys, xs, strict=True):
        if isinstance(y, int) and isinstance(x, int):
            _match_node(g, g.nodes[y], g.nodes[x], loop, k, plan)
        elif isinstance(y, Loop) and isinstance(x, Loop) and (y.fnode, y.n) == (x.fnode, x.n):
            for py, px in zip(y.parts, x.parts, strict=True):
                _match(g, py, px, loop, k, plan)
        elif isinstance(y, Unrolled) and isinstance(x, Unrolled) and y.fnode == x.fnode:
            _match(g, y.items, x.items, loop, k, plan)
        else:
            raise _NotALoop("a nested region is a loop in one part and not in another")


def _match_node(g: Graph, y: Node, x: Node, loop: Loop, k: int, plan: LoopPlan) -> None:
    if (y.op, y.multi_output, len(y.outputs)) != (x.op, x.multi_output, len(x.outputs)):
        raise _NotALoop(f"{y.name} ({y.op}) against {x.name} ({x.op})")
    own_slice = (_role(y) == "slice" and _path(y)[-1:] == ((loop.fnode, k),))
    y_args, x_args = list(y.args), list(x.args)
    if own_slice:
        if len(x_args) != 4 or x_args[2] != 0:
            raise _NotALoop(f"slice {x.name} does not start at 0 in part 0")
        step = x_args[3] - x_args[2]
        if y_args[2:] != [k * step, (k + 1) * step]:
            raise _NotALoop(f"slice {y.name} is not part {k} of {step}")
        y_args, x_args = y_args[:2], x_args[:2]
    if not _same(y_args, x_args, plan) or not _same(y.kwargs, x.kwargs, plan):
        raise _NotALoop(f"{y.name} and {x.name} differ in their arguments")
    for ty, tx in zip(y.outputs, x.outputs, strict=True):
        if (ty is None) != (tx is None):
            raise _NotALoop(f"{y.name} and {x.name} differ in their outputs")
        if ty is not None and tx is not None:
            plan.canonical[ty] = _canon(plan, tx)
    plan.same_as[y.id] = plan.same_as.get(x.id, x.id)


def _same(a: Any, b: Any, plan: LoopPlan) -> bool:
    if isinstance(a, TensorRef) and isinstance(b, TensorRef):
        return _canon(plan, a.id) == _canon(plan, b.id)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(
            _same(x, y, plan) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key], plan) for key in a)
    if isinstance(a, TensorRef) or isinstance(b, TensorRef):
        return False
    return type(a) is type(b) and a == b


def _slice_exprs(g: Graph, loop: Loop, plan: LoopPlan) -> None:
    """Body slices of this loop: `part * step`, `(part + 1) * step`."""
    for it in loop.parts[0]:
        if not isinstance(it, int):
            continue
        node = g.nodes[it]
        if _role(node) == "slice" and _path(node)[-1:] == ((loop.fnode, 0),):
            step = node.args[3] - node.args[2]
            plan.slices[it] = (f"{loop.var} * {step}", f"({loop.var} + 1) * {step}")


def _canon_node(plan: LoopPlan, nid: int) -> int:
    return plan.same_as.get(nid, nid)


# ------------------------------------------------------------------ frees
def _plan_dels(g: Graph, items: list[Item], frees: Mapping[int, list[int]], plan: LoopPlan) -> None:
    """Where the emitted body deletes each tensor, checked against every part's frees."""
    stack_of: dict[int, tuple[tuple[Loop, int], ...]] = {}   # node -> enclosing (loop, part)
    reads_in: dict[int, tuple[tuple[Loop, int], ...]] = {}   # a guarded node -> where it runs

    def walk(its: list[Item], stack: tuple[tuple[Loop, int], ...]) -> None:
        for it in its:
            if isinstance(it, int):
                stack_of[it] = stack
            elif isinstance(it, Loop):
                for k, p in enumerate(it.parts):
                    walk(p, (*stack, (it, k)))
                for _, k, nid in it.guarded:    # run once: what they make is no part's
                    stack_of[nid] = stack
                    reads_in[nid] = (*stack, (it, k))
            else:
                walk(it.items, stack)

    walk(items, ())
    producer = {t: nid for nid in stack_of for t in g.nodes[nid].output_ids()}
    _check_scopes(g, stack_of, producer, reads_in)
    # body node -> tensor -> (depth, part) of the loops in whose part only it is deleted there
    declared: dict[int, dict[int, tuple[tuple[int, int], ...]]] = {}
    for nid, stack in stack_of.items():
        for t in frees.get(nid, []):
            u = _canon(plan, t)
            where = stack_of.get(producer[u], ()) if u in producer else ()
            common = 0
            while (common < min(len(stack), len(where))
                   and stack[common][0].fnode == where[common][0].fnode):
                common += 1
            declared.setdefault(_canon_node(plan, nid), {})[u] = tuple(
                (d, stack[d][1]) for d in range(common, len(stack)))
    for nid, stack in stack_of.items():
        actual = {_canon(plan, t) for t in frees.get(nid, [])}
        predicted = {u for u, parts in declared.get(_canon_node(plan, nid), {}).items()
                     if all(stack[d][1] == k for d, k in parts)}
        if actual != predicted:
            if not stack:
                raise RuntimeError(f"internal: frees of node {nid} are not those of its body node")
            raise _NotALoop("its parts free different tensors", stack[0][0].key)
    for x, tensors in declared.items():
        stack = stack_of[x]
        by_cond: dict[str, list[int]] = {}
        for u, parts in tensors.items():
            cond = " and ".join(f"{stack[d][0].var} == {k}" for d, k in parts)
            by_cond.setdefault(cond, []).append(u)
        plan.dels[x] = sorted(by_cond.items(), key=lambda kv: (kv[0] != "", kv[0]))
    for nid, stack in stack_of.items():
        if stack and nid not in reads_in:
            cond = " and ".join(f"{loop.var} == {k}" for loop, k in stack)
            plan.counterparts.setdefault(_canon_node(plan, nid), []).append((cond, nid))


def _check_scopes(g: Graph, stack_of: Mapping[int, tuple[tuple[Loop, int], ...]],
                  producer: Mapping[int, int], reads_in: Mapping[int, tuple[tuple[Loop, int], ...]]) -> None:
    """Every tensor is read in the loop iteration that made it (or in one enclosing it): a
    tensor of one part read by another part or after the loop would not be that iteration's
    variable. A guarded node (reads_in: the iteration it runs in) reads part 0's tensors only,
    the ones under the body's names. _NotALoop for the loop the tensor would escape from."""
    for nid, stack in stack_of.items():
        if nid in reads_in:
            stack = reads_in[nid]
            made_in_part = [t for t in g.nodes[nid].input_ids() if t in producer
                            and any(k for _, k in stack_of.get(producer[t], ()))]
            if made_in_part:
                first = made_in_part[0]
                raise _NotALoop(f"{g.nodes[nid].name}, outside it, reads {g.tensors[first].name or first} "
                                "of a part other than part 0", stack[-1][0].key)
        for t in g.nodes[nid].input_ids():
            made = stack_of.get(producer[t], ()) if t in producer else ()
            common = 0
            while (common < min(len(made), len(stack)) and made[common][0] is stack[common][0]
                   and made[common][1] == stack[common][1]):
                common += 1
            if common < len(made):
                raise _NotALoop(f"{g.nodes[nid].name} reads {g.tensors[t].name or t} outside the "
                                "loop iteration that makes it", made[common][0].key)


# ------------------------------------------------------------------ names
_PART = re.compile(r"_p\d+(?=_|$)")


def _display_names(g: Graph, plan: LoopPlan) -> None:
    """Body tensors are named like the original tensor (the '_p<k>' part marks that
    fission.expand puts in names dropped; '_part' added when the original name is still in
    use, e.g. by the preallocated whole tensor)."""
    taken = {m.name for m in g.tensors.values()}
    body = set(plan.canonical.values())
    for t in body:
        meta = g.tensors.get(t)
        if meta is None or not meta.name:
            continue
        base = _PART.sub("", meta.name)
        if base != meta.name:
            plan.display[t] = base if base not in taken else f"{base}_part"

