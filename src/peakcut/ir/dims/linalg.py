"""Rules of matrix products, attention and convolutions.

Contracted axes are reduce labels merged by "sum" (matmul k, a convolution's
input channels, the batch of a weight gradient) unless the op also adds a
term once per call (addmm's `self`, a convolution's bias): every part would
add it again, so the axis is then not a label. Sliding-window axes (height,
width, kernel) are never labels (MAGIS §4.1, footnote 2).
"""

from __future__ import annotations

from peakcut.ir.dims.call import Builder, Call, Labeling, aten
from peakcut.ir.dims.rule import Dims, Label
from peakcut.ir.dims.shapes import broadcast

_SUM = "sum"


def mm(call: Call) -> Labeling:
    return Labeling({"self": ("m", "k"), "mat2": ("k", "n")}, [("m", "n")], merge={"k": _SUM})


def bmm(call: Call) -> Labeling:
    return Labeling({"self": ("b", "m", "k"), "mat2": ("b", "k", "n")}, [("b", "m", "n")],
                    merge={"k": _SUM})


def dot(call: Call) -> Labeling:
    return Labeling({"self": ("k",), "tensor": ("k",)}, [()], merge={"k": _SUM})


def mv(call: Call) -> Labeling:
    return Labeling({"self": ("m", "k"), "vec": ("k",)}, [("m",)], merge={"k": _SUM})


def addmm(call: Call) -> Labeling:
    """addmm, baddbmm: beta*self + alpha*(a @ b); k is a label only when beta == 0."""
    batched = call.op == aten("baddbmm")
    a, b = ("batch1", "batch2") if batched else ("mat1", "mat2")
    lead: Dims = ("b",) if batched else ()
    k = "k" if call.args.get("beta", 1) == 0 else None
    out = (*lead, "m", "n")
    tensors = {"self": broadcast(call.optional_shape("self"), call.out, out),
               a: (*lead, "m", k), b: (*lead, k, "n")}
    return Labeling(tensors, [out], merge={"k": _SUM} if k else {})


def efficient_attention(call: Call) -> Labeling | None:
    """_scaled_dot_product_efficient_attention: batch and heads are spatial.

    Query/key lengths stay whole (causal masks and the log-sum-exp padding
    depend on absolute positions). With dropout the op draws random numbers:
    no rule (docs/design.md: randomness). The philox seed/offset outputs do not
    depend on the split ("same").
    """
    if call.args.get("dropout_p", 0.0):
        return None
    qkv = ("b", "h", None, None)
    bias_shape = call.optional_shape("attn_bias")
    full_bias = (*call.out[:2], call.out[2], call.shape("key")[2])
    tensors = {"query": qkv, "key": qkv, "value": qkv,
               "attn_bias": broadcast(bias_shape, full_bias, qkv)}
    return Labeling(tensors, [qkv, ("b", "h", None), (), ()])


def cpu_flash_attention(call: Call) -> Labeling | None:
    """_scaled_dot_product_flash_attention_for_cpu -> (output, logsumexp): batch and heads are
    spatial, the lengths whole (as efficient_attention); with dropout no rule."""
    if call.args.get("dropout_p", 0.0):
        return None
    qkv = ("b", "h", None, None)
    full_mask = (*call.out[:3], call.shape("key")[2])
    tensors = {"query": qkv, "key": qkv, "value": qkv,
               "attn_mask": broadcast(call.optional_shape("attn_mask"), full_mask, qkv)}
    return Labeling(tensors, [qkv, ("b", "h", None)])


def cpu_flash_attention_backward(call: Call) -> Labeling | None:
    """Its backward -> (grad_query, grad_key, grad_value): batch and heads, as the forward."""
    if call.args.get("dropout_p", 0.0):
        return None
    qkv = ("b", "h", None, None)
    full_mask = (*call.shape("query")[:3], call.shape("key")[2])
    tensors = {"grad_out": qkv, "query": qkv, "key": qkv, "value": qkv, "out": qkv,
               "logsumexp": ("b", "h", None),
               "attn_mask": broadcast(call.optional_shape("attn_mask"), full_mask, qkv)}
    return Labeling(tensors, [qkv, qkv, qkv])


def convolution(call: Call) -> Labeling | None:
    """convolution (NCHW, any number of spatial dims, plain or transposed, grouped).

    Batch "n" is spatial. groups == 1: out-channels "o" spatial; in-channels
    "c" reduce "sum" when there is no bias. groups > 1: whole groups "g" split
    input channels, weight rows, output channels and the `groups` argument.
    """
    x, w = call.shape("input"), call.shape("weight")
    if len(x) != len(w):
        return None  # unbatched input: not a layout this rule knows
    spatial: Dims = (None,) * (len(x) - 2)
    groups: int = call.arg("groups")
    has_bias = call.optional_shape("bias") is not None
    if groups == 1:
        c = None if has_bias else "c"
        weight: Dims = (c, "o") if call.arg("transposed") else ("o", c)
        tensors: dict[str, Dims] = {"input": ("n", c, *spatial), "weight": (*weight, *spatial),
                                    "bias": ("o",)}
        return Labeling(tensors, [("n", "o", *spatial)], merge={"c": _SUM} if c else {})
    grouped: dict[str, Dims] = {"input": ("n", "g", *spatial), "weight": ("g", None, *spatial),
                                "bias": ("g",)}
    return Labeling(grouped, [("n", "g", *spatial)], sizes={"groups": ("g",)})


def convolution_backward(call: Call) -> Labeling | None:
    """convolution_backward -> (grad_input, grad_weight, grad_bias) (None where not computed).

    Batch "n": grad_input spatial, grad_weight/grad_bias summed over it.
    groups == 1: out-channels "o": grad_weight/grad_bias spatial, grad_input
    summed; in-channels "c": grad_input/grad_weight spatial, grad_bias does not
    depend on it ("same"). groups > 1: whole groups "g" on every channel axis.
    """
    x, w = call.shape("input"), call.shape("weight")
    if len(x) != len(w):
        return None
    present = [shape is not None for shape in call.outputs]  # CPU may return more than masked
    spatial: Dims = (None,) * (len(x) - 2)
    groups: int = call.arg("groups")
    transposed: bool = call.arg("transposed")
    has_bias_sizes = call.arg("bias_sizes") is not None
    if groups == 1:
        c = "c" if (present[0] or present[1]) else None  # grad_bias alone does not depend on c
        weight: Dims = (c, "o") if transposed else ("o", c)
        outs: list[Dims] = [("n", c, *spatial), (*weight, *spatial), ("o",)]
        tensors: dict[str, Dims] = {"grad_output": ("n", "o", *spatial),
                                    "input": ("n", c, *spatial), "weight": (*weight, *spatial)}
        sizes: dict[str, Dims] = {"bias_sizes": ("o",)} if has_bias_sizes else {}
        merge: dict[Label, str] = {"n": _SUM, "o": _SUM}
    else:
        outs = [("n", "g", *spatial), ("g", None, *spatial), ("g",)]
        tensors = {"grad_output": ("n", "g", *spatial), "input": ("n", "g", *spatial),
                   "weight": ("g", None, *spatial)}
        sizes = {"groups": ("g",), **({"bias_sizes": ("g",)} if has_bias_sizes else {})}
        merge = {"n": _SUM}
    return Labeling(tensors, outs, sizes=sizes, merge=merge)


BUILDERS: dict[str, Builder] = {
    aten("mm"): mm,
    aten("addmm"): addmm,
    aten("bmm"): bmm,
    aten("baddbmm"): addmm,
    aten("dot"): dot,
    aten("mv"): mv,
    aten("_scaled_dot_product_efficient_attention"): efficient_attention,
    aten("_scaled_dot_product_flash_attention_for_cpu"): cpu_flash_attention,
    aten("_scaled_dot_product_flash_attention_for_cpu_backward"): cpu_flash_attention_backward,
    aten("convolution"): convolution,
    aten("convolution_backward"): convolution_backward,
}
