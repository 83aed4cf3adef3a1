"""Recompute a step's cheap saved activations for the backward, keeping what the matmuls and
convolutions made (what torch.compile's min-cut partitioner saves): each element-wise op
whose output the backward reads (a ReLU's output, a ResNet block's relu(bn(x) + identity);
directly, through the forward's detach of it, or through a forward view of it, as a
transformer's GELU output is read by the next linear's weight gradient through its `view`:
that view is then made again from the recompute, views_for_readers) is recomputed with remat_chain for its readers after the forward, so its output and the
cheap inputs behind it (a batch norm's result: its normalize from the saved statistics) are
freed after the forward.

The ops are taken last to first, so that one recompute serves every later reader: when a
block's output is recomputed, the recompute of the next block's add (which reads it) is
already in the graph and is one of its readers. One Rewrite for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.edit import GraphEditor, rewired
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tags import RematTag
from peakcut.transform.remat import why_not_recompute_node, why_not_remat
from peakcut.transform.remat_chain import remat_chain
from peakcut.transform.rewrite import Rewrite, RuleError, identity_views, positions, spliced


def _is_view(g: Graph, node: int) -> bool:
    info = lookup(g.nodes[node].op)
    return info is not None and info.kind is OpKind.VIEW and len(g.nodes[node].output_ids()) == 1


def _forward_views(g: Graph, out: int) -> list[int]:
    """Tensors made from `out` by forward view ops that are not identity views (a reshape, a
    transpose; transitively), in discovery order: the backward often reads a saved activation
    through one (a GELU's output through the next linear's `view`)."""
    identities = set(identity_views(g, out))
    found: list[int] = []
    frontier = [out, *identities]
    while frontier:
        t = frontier.pop()
        for u in g.users(t):
            if g.nodes[u].phase is not Phase.FORWARD or not _is_view(g, u):
                continue
            (v,) = g.nodes[u].output_ids()
            if v not in identities and v not in found and g.tensors[v].storage == g.tensors[out].storage:
                found.append(v)
                frontier.append(v)
    return found


def _later_readers(g: Graph, node: int) -> list[int]:
    """The readers outside the forward of node's one output or of its identity views, by id
    (remat orders them; a walk of the order here made the rule's sites quadratic)."""
    (out,) = g.nodes[node].output_ids()
    tensors = (out, *identity_views(g, out))
    return sorted({u for t in tensors for u in g.users(t) if g.nodes[u].phase is not Phase.FORWARD})


def _through_views(g: Graph, node: int) -> list[tuple[int, list[int]]]:
    """(forward view of node's output, its readers outside the forward) where there are any."""
    (out,) = g.nodes[node].output_ids()
    found = []
    for v in _forward_views(g, out):
        readers = sorted(u for u in g.users(v) if g.nodes[u].phase is not Phase.FORWARD)
        if readers:
            found.append((v, readers))
    return found


def saved_activations(g: Graph) -> list[int]:
    """Forward element-wise ops with one output that a node outside the forward reads (directly,
    through an identity view, or through forward views of it), in forward order."""
    found = []
    for v in g.order:
        n = g.nodes[v]
        info = lookup(n.op)
        if (n.phase is Phase.FORWARD and info is not None and info.kind is OpKind.ELEMENTWISE
                and len(n.output_ids()) == 1 and n.tags.get(RematTag) is None
                and (_later_readers(g, v) or _through_views(g, v))):
            found.append(v)
    return found


def _view_chain(g: Graph, out: int, view: int) -> list[int]:
    """The view nodes from `out` (or an identity view of it) to `view`, first to last."""
    sources = {out, *identity_views(g, out)}
    chain: list[int] = []
    t = view
    while t not in sources:
        producer = g.producer(t)
        read = g.nodes[producer].args[0] if producer is not None else None
        if producer is None or not _is_view(g, producer) or not isinstance(read, TensorRef):
            raise RuleError(f"internal: tensor {view} is not a view chain of tensor {out}")
        chain.append(producer)
        t = read.id
    return chain[::-1]


def views_for_readers(g: Graph, order: Sequence[int], node: int) -> tuple[Graph, list[int], list[int], list[int]]:
    """Each forward view of node's output that the backward reads (`_through_views`) made again
    from the output right before its first reader outside the forward, and those readers
    rewired to the copy: the graph, order, the nodes added and the readers rewired. The copies
    then read the output directly, so a recompute of `node` serves them, and the views move
    into its storage."""
    views = _through_views(g, node)
    if not views:
        return g, list(order), [], []
    (out,) = g.nodes[node].output_ids()
    edit = GraphEditor(g)
    pos = positions(order)
    placed: list[tuple[int, list[int]]] = []      # (first reader, copies to run right before it)
    for view, readers in views:
        first = min(readers, key=pos.__getitem__)
        chain = _view_chain(g, out, view)
        source = g.nodes[chain[0]].args[0]
        mapping = {source.id: out} if isinstance(source, TensorRef) and source.id != out else {}
        copies = []
        for p in chain:
            n = rewired(g.nodes[p], mapping)
            copy = edit.add_op(n.op, n.args, dict(n.kwargs), name=f"{n.name or p}_again",
                               phase=g.nodes[first].phase, module=n.module)
            mapping[g.nodes[p].output_ids()[0]] = copy.output_ids()[0]
            copies.append(copy.id)
        for u in readers:
            edit.rewire(u, {view: mapping[view]})
        placed.append((first, copies))
    before = {c: [first] for first, copies in placed for c in copies}
    edit.set_order(spliced(g.order, before=before))
    added = [c for _, copies in placed for c in copies]
    rewired_readers = sorted({u for _, readers in views for u in readers})
    return edit.finish(), spliced(order, before=before), added, rewired_readers


def why_not_recompute_activation(g: Graph, order: Sequence[int], node: int, *, exact: bool = True) -> str | None:
    """Why the readers after the forward of `node`'s output cannot read a recompute (None: they can).

    Readers through forward views are judged on the graph with the views made again
    (views_for_readers: a copy of the graph). exact=False judges such a node by its op and
    outputs, and its direct readers, only (why_not_recompute_node): what the rule's sites
    use, since a copy per site made them 20x slower on GPT-Neo-1.3B (5.4 s against 0.23 s);
    recompute_activations then checks each node exactly and leaves out those that fail."""
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    if _through_views(g, node):
        if not exact:
            direct = _later_readers(g, node)
            return why_not_remat(g, order, node, direct) if direct else why_not_recompute_node(g, node)
        g, order, _, _ = views_for_readers(g, order, node)
    readers = _later_readers(g, node)
    if not readers:
        return f"nothing outside the forward reads the output of {g.nodes[node].name or node}"
    return why_not_remat(g, order, node, readers)


def recompute_activations(g: Graph, order: Sequence[int], nodes: Sequence[int]
                          ) -> tuple[Rewrite | None, list[str | None]]:
    """Every node of `nodes` that can be, recomputed for its readers after the forward (module
    doc); the reason per node (None: done). The Rewrite is None when none could."""
    pos = {v: i for i, v in enumerate(g.order)}
    reasons: dict[int, str | None] = {}
    current, current_order = g, list(order)
    added: list[int] = []
    changed: list[int] = []
    for v in sorted(nodes, key=lambda v: -pos.get(v, -1)):
        viewed, viewed_order, copies, readers = views_for_readers(current, current_order, v)
        reason = why_not_recompute_activation(viewed, viewed_order, v)     # no views left to make
        reasons[v] = reason
        if reason is None:
            r = remat_chain(viewed, viewed_order, v, _later_readers(viewed, v))
            current, current_order = r.graph, r.order
            added += [*copies, *r.added]
            changed += [*readers, *r.changed]
    done = [v for v in nodes if reasons[v] is None]
    if not done:
        return None, [reasons[v] for v in nodes]
    new = set(added)
    return Rewrite(graph=current, order=current_order, added=tuple(added),
                   changed=tuple(dict.fromkeys(v for v in changed if v not in new)), removed=(),
                   description=f"recompute {len(done)} saved activations (and the cheap ops behind them) "
                               "for the backward"), [reasons[v] for v in nodes]
