"""A language model's head and loss as one unit of a captured step: the vocabulary projection
(`mm` of the hidden rows by the transposed vocabulary weight), what turns its logits into the
log-softmax's input (views, a scale, a cast, the shift of the sequence), the log-softmax,
`nll_loss_forward`, and their backward up to the two gradient matmuls (the weight's and the
hidden rows'). `find_head_loss` says why a step has none where it has none: class weights,
no reduction, a reader of the logits or log-probabilities besides the loss (a z-loss, label
smoothing, the logits returned), dropout or another op between the logits and the loss.

The logits' rows are (batch, position) pairs, batch-major: the unit records the batch B, the
positions S of the projection, the positions [start, end) the loss reads (the shift
`logits[:, :-1]`), and the element-wise steps (a scale, a cast) in the order each direction
runs them, so that a part of the rows can be run the same way (peakcut.transform.chunked_loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.registry import lookup
from peakcut.transform.rewrite import describe_node

MM = "aten.mm.default"
T = "aten.t.default"
LOG_SOFTMAX = "aten._log_softmax.default"
LOG_SOFTMAX_BACKWARD = "aten._log_softmax_backward_data.default"
NLL = "aten.nll_loss_forward.default"
NLL_BACKWARD = "aten.nll_loss_backward.default"
SLICE = "aten.slice.Tensor"
SLICE_BACKWARD = "aten.slice_backward.default"
TO_COPY = "aten._to_copy.default"
MEAN, SUM = 1, 2                      # nll_loss's reduction codes
EXACT_COUNT = 2 ** 24                 # float32 counts every target up to here exactly
_LAYOUT = ("aten.view.default", "aten._unsafe_view.default", "aten.alias.default", "aten.clone.default")
_SCALE = ("aten.mul.Tensor", "aten.div.Tensor")

Step = tuple[str, object]
"""An element-wise step: ("mul" | "div", a number) or ("cast", a dtype name)."""


@dataclass(frozen=True)
class HeadLoss:
    """One head and loss (module doc); tensors and nodes of the captured step."""

    loss: int                         # the nll_loss_forward node
    x: int                            # hidden rows, R x D (R = B * S)
    wt: int                           # transposed vocabulary weight, D x V
    logits_mm: int                    # the projection
    target: int                       # the loss's targets, B * (end - start)
    batch: int
    positions: int                    # S
    start: int
    end: int
    forward_steps: tuple[Step, ...]   # logits -> the log-softmax's input
    backward_steps: tuple[Step, ...]  # the log-softmax's gradient -> the logits' gradient
    reduction: int
    ignore_index: int
    grad_output: int                  # the loss's gradient
    weight_grad_mm: int               # mm(t(g), x) (V x D) or mm(t(x), g) (D x V)
    weight_grad_transposed: bool      # True: the latter
    input_grad_mm: int                # mm(g, t(wt)), R x D
    removed: tuple[int, ...]          # every node of the unit, in capture order


def _ref(arg: object) -> int | None:
    return arg.id if isinstance(arg, TensorRef) else None


def _random_reader(g: Graph, t: int) -> int | None:
    """A random node reading t, directly or through a node made from nothing but t's shape
    (dropout: `empty_like` then `bernoulli_`)."""
    for u in g.users(t):
        for v in (u, *(w for o in g.nodes[u].output_ids() for w in g.users(o))):
            info = lookup(g.nodes[v].op)
            if info is not None and info.random:
                return v
    return None


def _only_reader(g: Graph, t: int, what: str) -> int | str:
    users = g.users(t)
    if t in g.outputs:
        return f"the {what} {g.tensors[t].name or t} is an output of the step"
    drop = _random_reader(g, t)
    if drop is not None:
        return f"{describe_node(g, drop)} draws at random from the {what} (dropout): the chunks would draw differently"
    if len(users) != 1:
        names = ", ".join(describe_node(g, u) for u in users[:3])
        return f"the {what} {g.tensors[t].name or t} is read by {len(users)} nodes ({names}): a z-loss, label smoothing or another reader besides the loss"
    return users[0]


def _step(g: Graph, nid: int) -> Step | None:
    n = g.nodes[nid]
    if n.op in _SCALE and len(n.args) == 2 and isinstance(n.args[1], int | float) and not isinstance(n.args[1], bool):
        return ("mul" if n.op == _SCALE[0] else "div", n.args[1])
    if n.op == TO_COPY and set(n.kwargs) <= {"dtype", "layout", "device"} and "dtype" in n.kwargs:
        out = g.tensors[n.output_ids()[0]]
        return ("cast", out.dtype)
    return None


def _refuse_op(g: Graph, nid: int, where: str) -> str:
    info = lookup(g.nodes[nid].op)
    if info is not None and info.random:
        return f"{describe_node(g, nid)} {where} is random (dropout): the chunks would draw differently"
    return f"{describe_node(g, nid)} {where} is no view, scale, cast or shift of the sequence"


def _forward_chain(g: Graph, logits: int, z: int) -> tuple[int, int, int, int, list[Step], list[int]] | str:
    """(B, S, start, end, element-wise steps, nodes) from the projection's result to the
    log-softmax's input, or why not."""
    rows, vocab = g.tensors[logits].shape
    batch, positions, start, end = 1, rows, 0, rows
    steps: list[Step] = []
    nodes: list[int] = []
    sliced = False
    t = logits
    while t != z:
        u = _only_reader(g, t, "logits")
        if isinstance(u, str):
            return u
        n = g.nodes[u]
        out = n.output_ids()[0] if n.output_ids() else None
        if out is None:
            return _refuse_op(g, u, "between the logits and the loss")
        shape = g.tensors[out].shape
        if shape[-1:] != (vocab,) or len(shape) not in (2, 3):
            return f"{describe_node(g, u)} reshapes the logits to {shape}"
        step = _step(g, u)
        if step is not None:
            steps.append(step)
        elif n.op == SLICE:
            args = list(n.args) + [None] * (5 - len(n.args))
            dim, lo, hi, stride = args[1], args[2] or 0, args[3], args[4] or 1
            if sliced or len(g.tensors[t].shape) != 3 or dim not in (1, -2) or stride != 1:
                return f"{describe_node(g, u)} slices the logits other than along the sequence once"
            start, end = _bounds(lo, hi, positions)
            sliced = True
        elif n.op not in _LAYOUT:
            return _refuse_op(g, u, "between the logits and the loss")
        elif len(shape) == 3 and not sliced and shape[0] * shape[1] == rows:
            batch, positions, end = shape[0], shape[1], shape[1]
        if shape not in ((batch * (end - start), vocab), (batch, end - start, vocab)):
            return f"{describe_node(g, u)} views the logits as {shape}, not as batch x positions"
        nodes.append(u)
        t = out
    last = _only_reader(g, z, "logits")
    if isinstance(last, str):
        return last
    if len(g.tensors[z].shape) != 2 or g.tensors[z].shape[0] != batch * (end - start):
        return f"the log-softmax's input has shape {g.tensors[z].shape}, not {batch * (end - start)} rows"
    return batch, positions, start, end, steps, nodes


def _bounds(lo: int, hi: int | None, size: int) -> tuple[int, int]:
    lo = lo + size if lo < 0 else lo
    hi = size if hi is None else (hi + size if hi < 0 else hi)
    return max(0, min(lo, size)), max(0, min(hi, size))


def _backward_chain(g: Graph, u: HeadLossParts, gz: int) -> tuple[int, list[Step], list[int]] | str:
    """(the logits' gradient, its element-wise steps, nodes) from the log-softmax's gradient."""
    steps: list[Step] = []
    nodes: list[int] = []
    t = gz
    rows, vocab = g.tensors[u.logits].shape
    while True:
        users = g.users(t)
        if t in g.outputs:
            return f"the logits' gradient {g.tensors[t].name or t} is an output of the step"
        if len(users) != 1 or g.nodes[users[0]].op in (T, MM):
            break
        v = users[0]
        n = g.nodes[v]
        out = n.output_ids()[0]
        step = _step(g, v)
        if step is not None:
            steps.append(step)
        elif n.op == SLICE_BACKWARD:
            sizes, dim, lo, hi, stride = n.args[1], n.args[2], n.args[3], n.args[4], n.args[5]
            lo, hi = _bounds(lo, hi, u.positions)
            if (list(sizes) != [u.batch, u.positions, vocab] or dim not in (1, -2) or stride != 1
                    or (lo, hi) != (u.start, u.end)):
                return f"{describe_node(g, v)} is not the backward of the logits' shift"
        elif n.op not in _LAYOUT:
            return _refuse_op(g, v, "between the loss's gradient and the head's")
        nodes.append(v)
        t = out
    if g.tensors[t].shape != (rows, vocab) or g.tensors[t].dtype != g.tensors[u.logits].dtype:
        return f"the logits' gradient {g.tensors[t].name or t} is {g.tensors[t].shape}, not the logits' {(rows, vocab)}"
    return t, steps, nodes


@dataclass(frozen=True)
class HeadLossParts:
    """What the forward walk found (what the backward walk checks against)."""

    logits: int
    batch: int
    positions: int
    start: int
    end: int


def _grad_matmuls(g: Graph, gm: int, x: int, wt: int) -> tuple[int, bool, int, list[int]] | str:
    """(the weight's gradient matmul, transposed?, the rows' gradient matmul, the t nodes)."""
    weight: tuple[int, bool] | None = None
    rows: int | None = None
    views: list[int] = []
    for u in g.users(gm):
        n = g.nodes[u]
        if n.op == T:
            views.append(u)
            tg = n.output_ids()[0]
            for m in g.users(tg):
                if g.nodes[m].op == MM and _ref(g.nodes[m].args[0]) == tg and _ref(g.nodes[m].args[1]) == x and weight is None:
                    weight = (m, False)
                else:
                    return f"{describe_node(g, m)} reads the logits' gradient besides the head's backward"
        elif n.op == MM and _ref(n.args[0]) == gm and rows is None and _is_t_of(g, _ref(n.args[1]), wt):
            rows = u
        elif n.op == MM and _ref(n.args[1]) == gm and weight is None and _is_t_of(g, _ref(n.args[0]), x):
            weight = (u, True)
        else:
            return f"{describe_node(g, u)} reads the logits' gradient besides the head's backward"
    if weight is None or rows is None:
        return "the logits' gradient reaches no weight-gradient and row-gradient matmul"
    return weight[0], weight[1], rows, views


def _is_t_of(g: Graph, t: int | None, source: int) -> bool:
    if t is None:
        return False
    p = g.producer(t)
    return p is not None and g.nodes[p].op == T and _ref(g.nodes[p].args[0]) == source


def find_head_loss(g: Graph, loss: int) -> HeadLoss | str:
    """The head and loss of `loss` (an nll_loss_forward node), or why it is none (module doc)."""
    n = g.nodes[loss]
    if n.op != NLL:
        return f"{describe_node(g, loss)} is no nll_loss_forward"
    lsm, target = _ref(n.args[0]), _ref(n.args[1])
    if n.args[2] is not None:
        return f"{describe_node(g, loss)} weighs the classes"
    if n.args[3] not in (MEAN, SUM):
        return f"{describe_node(g, loss)} keeps one loss per token (reduction 'none')"
    if lsm is None or target is None:
        return f"{describe_node(g, loss)} reads no log-probabilities or targets"
    if g.tensors[target].numel >= EXACT_COUNT:
        return f"{describe_node(g, loss)} has 2**24 targets or more: their count is not exact in float32"
    p = g.producer(lsm)
    if p is None or g.nodes[p].op != LOG_SOFTMAX or g.nodes[p].args[1] not in (1, -1) or g.nodes[p].args[2] is not False:
        return f"{describe_node(g, loss)} reads no log-softmax over the vocabulary"
    z = _ref(g.nodes[p].args[0])
    logits = _logits(g, z)
    if isinstance(logits, str):
        return logits
    mm = g.producer(logits)
    if mm is None:
        return "internal: the logits have no producer"
    x, wt = _ref(g.nodes[mm].args[0]), _ref(g.nodes[mm].args[1])
    if x is None or wt is None:
        return f"{describe_node(g, mm)} reads no hidden rows and weight"
    fwd = _forward_chain(g, logits, z) if z is not None else "no log-softmax input"
    if isinstance(fwd, str):
        return fwd
    batch, positions, start, end, fsteps, fnodes = fwd
    parts = HeadLossParts(logits, batch, positions, start, end)
    bwd = _loss_backward(g, loss, lsm, p)
    if isinstance(bwd, str):
        return bwd
    nll_bw, lsm_bw, detaches, grad_output = bwd
    chain = _backward_chain(g, parts, g.nodes[lsm_bw].output_ids()[0])
    if isinstance(chain, str):
        return chain
    gm, bsteps, bnodes = chain
    mms = _grad_matmuls(g, gm, x, wt)
    if isinstance(mms, str):
        return mms
    wmm, transposed, xmm, views = mms
    total = n.output_ids()[1]
    for u in g.users(total):
        if u != nll_bw:
            return f"{describe_node(g, u)} reads the loss's count of targets"
    if total in g.outputs:
        return "the loss's count of targets is an output of the step"
    pos = {v: i for i, v in enumerate(g.order)}
    removed = sorted({mm, *fnodes, p, loss, *detaches, nll_bw, lsm_bw, *bnodes, *views, wmm, xmm}, key=pos.__getitem__)
    if pos[nll_bw] < pos[loss] or any(pos[v] < pos[nll_bw] for v in (lsm_bw, *bnodes, wmm, xmm)):
        return "the loss's backward runs before the loss"
    return HeadLoss(loss, x, wt, mm, target, batch, positions, start, end, tuple(fsteps), tuple(bsteps),
                    int(n.args[3]), int(n.args[4]), grad_output, wmm, transposed, xmm, tuple(removed))


def _logits(g: Graph, z: int | None) -> int | str:
    """The projection's result the log-softmax's input comes from (through the chain)."""
    t = z
    while t is not None:
        p = g.producer(t)
        if p is None:
            return "the log-softmax's input comes from no vocabulary projection"
        n = g.nodes[p]
        if n.op == MM:
            return t
        if n.op not in (*_LAYOUT, SLICE, TO_COPY, *_SCALE):
            return _refuse_op(g, p, "between the logits and the loss")
        t = _ref(n.args[0])
    return "the log-softmax's input comes from no vocabulary projection"


def _loss_backward(g: Graph, loss: int, lsm: int, lsm_node: int) -> tuple[int, int, list[int], int] | str:
    """(nll_loss_backward, _log_softmax_backward_data, detaches of the log-probabilities, the
    loss's gradient), or why the log-probabilities have other readers."""
    nll_bw: int | None = None
    lsm_bw: int | None = None
    detaches: list[int] = []
    frontier = [lsm]
    while frontier:
        t = frontier.pop()
        if t in g.outputs:
            return f"the log-probabilities {g.tensors[t].name or t} are an output of the step"
        for u in g.users(t):
            n = g.nodes[u]
            if n.op == "aten.detach.default":
                detaches.append(u)
                frontier.extend(n.output_ids())
            elif u == loss:
                continue
            elif n.op == NLL_BACKWARD and nll_bw is None and _same_loss(g, n.args, g.nodes[loss].args):
                nll_bw = u
            elif n.op == LOG_SOFTMAX_BACKWARD and lsm_bw is None and n.args[2] == g.nodes[lsm_node].args[1]:
                lsm_bw = u
            else:
                return (f"{describe_node(g, u)} reads the log-probabilities besides the loss "
                        "(label smoothing, a z-loss or another term)")
    if nll_bw is None or lsm_bw is None:
        return "the loss has no backward through the log-softmax"
    grad_lsm = g.nodes[nll_bw].output_ids()[0]
    if _ref(g.nodes[lsm_bw].args[0]) != grad_lsm or g.users(grad_lsm) != [lsm_bw] or grad_lsm in g.outputs:
        return "the log-softmax's backward reads another gradient than the loss's"
    grad_output = _ref(g.nodes[nll_bw].args[0])
    if grad_output is None:
        return "the loss's backward reads no gradient"
    return nll_bw, lsm_bw, detaches, grad_output


def _same_loss(g: Graph, bw: Sequence[object], fw: Sequence[object]) -> bool:
    """nll_loss_backward's target, weight, reduction and ignore_index are the forward's."""
    return _ref(bw[2]) == _ref(fw[1]) and bw[3] is None and bw[4] == fw[3] and bw[5] == fw[4]


def find_head_losses(g: Graph) -> list[HeadLoss | str]:
    """The head and loss (or why none) of every nll_loss_forward of g, in capture order."""
    return [find_head_loss(g, v) for v in g.order if g.nodes[v].op == NLL]
