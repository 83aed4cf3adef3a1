"""Written-out attention as one fused kernel: the scores matmul, its scale, its masks, the
softmax and the value matmul of a captured step (GPT-Neo's and BTLM's attention, as
transformers writes it out) replaced by the fused attention PyTorch picks for the device
(`scaled_dot_product_attention`'s backend), forward and backward, as make_fx captures them.
The fused kernel never holds the batch x heads x sequence x sequence scores: the forward
keeps its output and the rows' log-sum-exp for the backward.

A unit (`find_units`) is a forward softmax over the last dim whose input comes from a
batched matmul through views, a scale by a number (mul / div), boolean masks (`where` with a
fill of at most MASK_FILL: a causal mask) and additive masks (`add` of a tensor that takes no
gradient), and whose output reaches the value matmul through a cast, expand and views only
(no dropout); the backward is the pair of matmuls each of the two forward matmuls has and the
softmax's backward between them. The masks become one additive bias: where(c, s, fill) + m
is s + where(c, m, fill + m) up to the fill's rounding (exp of either is 0).

`fuse_attention` rewrites in two edits per unit: the forward (bias, fused call, its output
in the value matmul's place) and the backward (the bias again, the fused backward's three
gradients in the places of the gradient matmuls' results); the scores, the softmax and their backward go as
nothing reads them. `why_not_fuse` says why a unit does not apply (dropout, a mask that takes
a gradient, a backend PyTorch does not pick here, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.tensor import contiguous_strides, dtype_from_name
from peakcut.transform.rewrite import Rewrite, RuleError, compose_rewrites, describe_node
from peakcut.transform.taso.edit import Edit

MASK_FILL = -1e30         # a `where` fill at or below this masks a score out
SOFTMAX = "aten._softmax.default"
BMM = "aten.bmm.default"
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FLASH_CPU_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
_VIEWS = ("aten.view.default", "aten._unsafe_view.default")
_TO_4D = (*_VIEWS, "aten.clone.default", "aten.expand.default")
_AFTER = (*_TO_4D, "aten._to_copy.default", "aten.detach.default")


@dataclass(frozen=True)
class Unit:
    """One written-out attention: nodes and tensors of the captured step (module doc)."""

    softmax: int
    q4: int                      # query, batch x heads x seq x head_dim
    kt4: int                     # key transposed, batch x heads x head_dim x seq
    v4: int                      # value, batch x heads x seq x head_dim
    q3: int                      # the scores matmul's operands and the value matmul's
    k3: int
    p3: int                      # the probabilities the value matmul reads
    v3: int
    out: int                     # the value matmul's result
    mask: tuple[tuple[str, Any], ...]   # ("mul", s) | ("where", (cond, fill)) | ("add", tensor), in order
    scale: float


def _producer_op(g: Graph, t: int) -> tuple[int | None, str]:
    p = g.producer(t)
    return p, (g.nodes[p].op if p is not None else "")


def _tensor(arg: object) -> int | None:
    return arg.id if isinstance(arg, TensorRef) else None


def _to_4d(g: Graph, t: int) -> int | None:
    """The 4-D tensor a batched matmul's operand is a view, expand or copy of (through copies
    and expands of the same shape too: the fused kernel reads the tensor they copy)."""
    while True:
        p, op = _producer_op(g, t)
        rank = len(g.tensors[t].shape)
        source = _tensor(g.nodes[p].args[0]) if p is not None and g.nodes[p].args else None
        if rank == 4 and (source is None or op not in ("aten.clone.default", "aten.expand.default")
                          or g.tensors[source].shape != g.tensors[t].shape):
            return t
        if op not in _TO_4D or source is None:
            return None
        t = source


def _key(g: Graph, kt4: int) -> int | None:
    """The key a transposed key is the transpose of (None: it is not one)."""
    p, op = _producer_op(g, kt4)
    if p is None or op != "aten.transpose.int":
        return None
    args = g.nodes[p].args
    return _tensor(args[0]) if {args[1] % 4, args[2] % 4} == {2, 3} else None


def _fill(g: Graph, arg: object) -> float | None:
    """The value of a `where`'s fill: a number, or a 0-dim tensor made from one."""
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return float(arg)
    t = _tensor(arg)
    while t is not None and g.tensors[t].shape == ():
        p, op = _producer_op(g, t)
        if p is None:
            return None
        args = g.nodes[p].args
        if op == "aten.scalar_tensor.default":
            return float(args[0])
        if op not in ("aten.lift_fresh_copy.default", "aten._to_copy.default", "aten.clone.default"):
            return None
        t = _tensor(args[0])
    return None


def _pre_chain(g: Graph, softmax: int) -> tuple[int, list[tuple[str, Any]], float] | str:
    """(the scores matmul, its masks in forward order, its scale) or why not."""
    t = _tensor(g.nodes[softmax].args[0])
    steps: list[tuple[str, Any]] = []
    scale = 1.0
    while t is not None:
        p, op = _producer_op(g, t)
        if p is None:
            return "the softmax's input is no matmul's result"
        n = g.nodes[p]
        if op == BMM:
            return p, steps[::-1], scale
        if op in _VIEWS:
            t = _tensor(n.args[0])
        elif op in ("aten.mul.Tensor", "aten.div.Tensor") and isinstance(n.args[1], int | float):
            s = float(n.args[1]) if op == "aten.mul.Tensor" else 1.0 / float(n.args[1])
            scale *= s
            steps.append(("mul", s))
            t = _tensor(n.args[0])
        elif op == "aten.where.self":
            fill = _fill(g, n.args[2])
            if fill is None or fill > MASK_FILL:
                return f"{describe_node(g, p)} fills with {fill}, not a mask the fused kernel can express"
            steps.append(("where", (_tensor(n.args[0]), fill)))
            t = _tensor(n.args[1])
        elif op == "aten.add.Tensor" and len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1:
            a, b = _tensor(n.args[0]), _tensor(n.args[1])
            chain, mask = (a, b) if a is not None and g.tensors[a].shape == g.tensors[t].shape else (b, a)
            if mask is None or chain is None:
                return f"{describe_node(g, p)} adds no mask tensor"
            steps.append(("add", mask))
            t = chain
        else:
            return f"{describe_node(g, p)} between the scores and the softmax is no scale or mask"
    return "the softmax's input is no tensor"


def _one_reader(g: Graph, t: int, op: str, arg: int) -> int | None:
    found = [u for u in g.users(t) if g.nodes[u].op == op and _tensor(g.nodes[u].args[arg]) == t]
    return found[0] if len(found) == 1 else None


def find_unit(g: Graph, softmax: int) -> Unit | str:
    """The unit of forward softmax node `softmax`, or why it is none."""
    n = g.nodes[softmax]
    x = _tensor(n.args[0]) if n.args else None
    if n.op != SOFTMAX or n.phase is not Phase.FORWARD or x is None:
        return f"{describe_node(g, softmax)} is no forward softmax"
    rank = len(g.tensors[x].shape)
    if rank != 4 or n.args[1] not in (-1, 3) or n.args[2] is not False:
        return f"{describe_node(g, softmax)} is no softmax over the last dim of a 4-D tensor"
    pre = _pre_chain(g, softmax)
    if isinstance(pre, str):
        return pre
    scores, mask, scale = pre
    q3, k3 = (_tensor(a) for a in g.nodes[scores].args[:2])
    # the probabilities reach the value matmul through views and a cast only
    (probs,) = n.output_ids()
    frontier, p3, out = [probs], None, None
    while frontier:
        t = frontier.pop()
        for u in g.users(t):
            un = g.nodes[u]
            if un.phase is not Phase.FORWARD:
                continue
            if un.op == BMM and _tensor(un.args[0]) == t:
                if out is not None:
                    return f"the probabilities of {describe_node(g, softmax)} reach two value matmuls"
                p3, out = t, un.output_ids()[0]
            elif un.op in _AFTER:
                if un.op != "aten.detach.default":
                    frontier.extend(un.output_ids())
            else:
                return (f"{describe_node(g, u)} reads the probabilities of {describe_node(g, softmax)}: "
                        "dropout or another op the fused kernel does not run")
    if out is None or p3 is None or q3 is None or k3 is None:
        return f"no value matmul reads the probabilities of {describe_node(g, softmax)}"
    v3 = _tensor(g.nodes[_made_by(g, out)].args[1])
    q4, kt4, v4 = (_to_4d(g, t) if t is not None else None for t in (q3, k3, v3))
    if q4 is None or kt4 is None or v4 is None or v3 is None:
        return f"the matmuls of {describe_node(g, softmax)} read no 4-D query, key and value"
    return Unit(softmax, q4, kt4, v4, q3, k3, p3, v3, out, tuple(mask), scale)


def find_units(g: Graph) -> list[Unit]:
    """Every unit of g, in capture order."""
    return [u for v in g.order if g.nodes[v].op == SOFTMAX
            and not isinstance(u := find_unit(g, v), str)]


def _gradients(g: Graph, u: Unit) -> tuple[int, int, int, int] | str:
    """(dO3, dV3, dQ3, dK3): the gradient the value matmul receives and the three gradient
    matmuls' results, or why they are not found."""
    found: dict[str, int] = {}
    for name, t, side in (("dV", u.p3, 0), ("dP", u.v3, 1), ("dK", u.q3, 0), ("dQ", u.k3, 1)):
        ts = [w for w in g.users(t) if g.nodes[w].op == "aten.transpose.int"
              and g.nodes[w].phase is Phase.BACKWARD]
        mms = [m for w in ts for o in g.nodes[w].output_ids() for m in g.users(o)
               if g.nodes[m].op == BMM and _tensor(g.nodes[m].args[side]) == o]
        if len(mms) != 1:
            return f"the backward has {len(mms)} gradient matmuls of {name} (expected 1)"
        found[name] = mms[0]
    d_out = _tensor(g.nodes[found["dV"]].args[1])
    if d_out is None or d_out != _tensor(g.nodes[found["dP"]].args[0]):
        return "the value matmul's two gradient matmuls read different gradients"
    dv, dq, dk = (g.nodes[found[k]].output_ids()[0] for k in ("dV", "dQ", "dK"))
    return d_out, dv, dq, dk


def pick_backend(g: Graph, u: Unit) -> str | None:
    """Why PyTorch picks no fused kernel we run for this unit (None: its CPU flash attention)."""
    if g.device != "cpu":
        return f"the graph runs on {g.device}: peakcut writes the CPU's fused attention only"
    q = g.tensors[u.q4]
    small = torch.zeros(1, 1, 2, q.shape[3], dtype=q.torch_dtype)
    bias = torch.zeros(1, 1, 2, 2, dtype=q.torch_dtype)
    choice: Any = torch._fused_sdp_choice(small, small, small, bias, 0.0, False, scale=u.scale)
    flash: Any = torch.nn.attention.SDPBackend.FLASH_ATTENTION
    if int(choice) != int(flash):
        return f"PyTorch picks backend {torch.nn.attention.SDPBackend(int(choice)).name} for {q.dtype} with head dim {q.shape[3]}, not a fused kernel"
    return None


def why_not_fuse(g: Graph, u: Unit) -> str | None:
    """Why unit `u` cannot be fused (None when it can)."""
    grads = _gradients(g, u)
    if isinstance(grads, str):
        return grads
    for kind, value in u.mask:
        if kind == "add" and g.tensors[value].dtype not in ("float32", "bfloat16", "float16", "float64"):
            return f"an additive mask of dtype {g.tensors[value].dtype}"
    if g.tensors[u.q4].dtype != g.tensors[u.kt4].dtype:
        return "the query and key differ in dtype"
    return pick_backend(g, u)


def _as(ed: Edit, t: int, shape: Sequence[int], where: dict[str, Any]) -> int:
    """t as a tensor of `shape` (a view when t is contiguous, else a contiguous copy's view)."""
    meta = ed.new.tensors[t]
    if meta.stride != contiguous_strides(meta.shape):
        t = ed.add("aten.clone.default", (TensorRef(t),), {"memory_format": torch.contiguous_format},
                   name=f"{where['name']}_c", **_loc(where)).output_ids()[0]
    return ed.add("aten.view.default", (TensorRef(t), list(shape)), name=f"{where['name']}_v",
                  **_loc(where)).output_ids()[0]


def _dense(ed: Edit, t: int, where: dict[str, Any]) -> int:
    """t, or a contiguous copy where its last dim is not dense (the fused kernel reads rows)."""
    meta = ed.new.tensors[t]
    if meta.stride[-1] == 1 or meta.shape[-1] == 1:
        return t
    return ed.add("aten.clone.default", (TensorRef(t),), {"memory_format": torch.contiguous_format},
                  name=f"{where['name']}_dense", **_loc(where)).output_ids()[0]


def _loc(where: dict[str, Any]) -> dict[str, Any]:
    return {"phase": where["phase"], "module": where["module"]}


def _cast(ed: Edit, t: int, dtype: str, where: dict[str, Any]) -> int:
    if ed.new.tensors[t].dtype == dtype:
        return t
    return ed.add("aten._to_copy.default", (TensorRef(t),), {"dtype": dtype_from_name(dtype)}, name=f"{where['name']}_cast",
                  **_loc(where)).output_ids()[0]


def _made_by(g: Graph, t: int) -> int:
    p = g.producer(t)
    if p is None:
        raise RuleError(f"tensor {t} is made by no node")
    return p


def _feeders(g: Graph, nodes: Sequence[int]) -> list[int]:
    return [p for n in nodes for t in g.nodes[n].input_ids() if (p := g.producer(t)) is not None]


def _bias(ed: Edit, u: Unit, dtype: str, where: dict[str, Any]) -> int | None:
    """The unit's masks as one additive bias of the query's dtype (module doc), made anew: the
    forward and the backward each make their own, so no bias is held between them (BTLM's,
    ALiBi plus the causal mask, is as large as the scores)."""
    torch_dtype = dtype_from_name(dtype)
    bias: int | None = None
    for kind, value in u.mask:
        if kind == "mul" and bias is not None:
            bias = ed.add("aten.mul.Tensor", (TensorRef(bias), value), name=f"{where['name']}_bias",
                          **_loc(where)).output_ids()[0]
        elif kind == "where":
            cond, fill = value
            fills = ed.add("aten.scalar_tensor.default", (fill,), {"dtype": torch_dtype}, name=f"{where['name']}_fill",
                           **_loc(where)).output_ids()[0]
            kept = bias if bias is not None else ed.add(
                "aten.scalar_tensor.default", (0.0,), {"dtype": torch_dtype}, name=f"{where['name']}_zero",
                **_loc(where)).output_ids()[0]
            bias = ed.add("aten.where.self", (TensorRef(cond), TensorRef(kept), TensorRef(fills)),
                          name=f"{where['name']}_bias", **_loc(where)).output_ids()[0]
        elif kind == "add":
            bias = value if bias is None else ed.add(
                "aten.add.Tensor", (TensorRef(bias), TensorRef(value)), name=f"{where['name']}_bias",
                **_loc(where)).output_ids()[0]
    if bias is not None:
        bias = _cast(ed, bias, dtype, where)
    return bias


def _forward(g: Graph, order: Sequence[int], u: Unit, label: str) -> tuple[Rewrite, dict[str, int]]:
    ed = Edit(g, order, label)
    sm = g.nodes[u.softmax]
    where = {"name": f"{sm.name}_fused", "phase": Phase.FORWARD, "module": sm.module}
    dtype = g.tensors[u.q4].dtype
    bias = _bias(ed, u, dtype, where)
    k4 = _key(g, u.kt4)
    if k4 is None:
        k4 = ed.add("aten.transpose.int", (TensorRef(u.kt4), -2, -1), name=f"{where['name']}_k",
                    **_loc(where)).output_ids()[0]
    q4, k4, v4 = (_dense(ed, _cast(ed, t, dtype, where), where) for t in (u.q4, k4, u.v4))
    kwargs = {"attn_mask": TensorRef(bias) if bias is not None else None, "scale": u.scale}
    fused = ed.add(FLASH_CPU, (TensorRef(q4), TensorRef(k4), TensorRef(v4), 0.0, False), kwargs,
                   name=where["name"], multi_output=True, **_loc(where))
    out4, lse = fused.output_ids()
    out = g.tensors[u.out]
    new_out = _as(ed, _cast(ed, out4, out.dtype, where), out.shape, where)
    ed.redirect({u.out: new_out})
    producer = _made_by(g, u.out)
    ed.remove(producer, stand_ins=(fused.id,))
    ed.remove_dead(_feeders(g, [producer]))
    rw = ed.finish([producer], f"{label}: {describe_node(g, u.softmax)}'s attention as {FLASH_CPU}")
    return rw, {"q4": q4, "k4": k4, "v4": v4, "out4": out4, "lse": lse}


def _backward(g: Graph, order: Sequence[int], u: Unit, made: dict[str, int], label: str) -> Rewrite:
    grads = _gradients(g, u)
    if isinstance(grads, str):
        raise RuleError(grads)
    d_out, dv3, dq3, dk3 = grads
    ed = Edit(g, order, label)
    where = {"name": f"{g.nodes[u.softmax].name}_fused_bw", "phase": Phase.BACKWARD,
             "module": g.nodes[_made_by(g, dv3)].module}
    dtype = g.tensors[made["q4"]].dtype
    go = _cast(ed, _as(ed, d_out, g.tensors[made["out4"]].shape, where), dtype, where)
    bias = _bias(ed, u, dtype, where)
    fused = ed.add(FLASH_CPU_BACKWARD,
                   (TensorRef(go), *(TensorRef(made[k]) for k in ("q4", "k4", "v4", "out4", "lse")), 0.0, False),
                   {"attn_mask": TensorRef(bias) if bias is not None else None, "scale": u.scale},
                   name=where["name"], multi_output=True, **_loc(where))
    gq, gk, gv = fused.output_ids()
    gkt = ed.add("aten.transpose.int", (TensorRef(gk), -2, -1), name=f"{where['name']}_kt",
                 **_loc(where)).output_ids()[0]
    mapping = {}
    for old, new in ((dv3, gv), (dq3, gq), (dk3, gkt)):
        meta = g.tensors[old]
        mapping[old] = _as(ed, _cast(ed, new, meta.dtype, where), meta.shape, where)
    ed.redirect(mapping)
    producers = [_made_by(g, t) for t in (dv3, dq3, dk3)]
    for p in producers:
        ed.remove(p, stand_ins=(fused.id,))
    ed.remove_dead(_feeders(g, producers))
    if u.softmax in ed.new.nodes:
        raise RuleError(f"{describe_node(g, u.softmax)}: its scores are read besides the attention")
    return ed.finish(producers, f"{label}: the backward of {describe_node(g, u.softmax)}'s attention "
                     f"as {FLASH_CPU_BACKWARD}")


def fuse_attention(g: Graph, order: Sequence[int], softmaxes: Sequence[int], label: str = "fused_attention"
                   ) -> Rewrite:
    """The units of `softmaxes` (forward softmax nodes) each run as one fused attention,
    forward and backward (module doc); RuleError names the first that does not apply."""
    steps: list[Rewrite] = []
    h, o = g, list(order)
    for s in softmaxes:
        u = find_unit(h, s)
        if isinstance(u, str):
            raise RuleError(u)
        why = why_not_fuse(h, u)
        if why is not None:
            raise RuleError(why)
        fwd, made = _forward(h, o, u, label)
        bwd = _backward(fwd.graph, fwd.order, u, made, label)
        steps += [fwd, bwd]
        h, o = bwd.graph, list(bwd.order)
    if not steps:
        raise RuleError("no attention to fuse")
    return compose_rewrites(g, steps, f"{label}: {len(softmaxes)} attention(s) as one fused kernel each")
