"""Rules of normalizations: layer norm, batch norm, group norm (and backwards).

Normalized axes are never labels. Training-mode batch norm computes its
statistics over batch and spatial axes, so only the channel is a label there;
in eval mode (running statistics) it is element-wise per channel. Group norm
splits whole groups of channels.
"""

from __future__ import annotations

from peakcut.ir.dims.call import Builder, Call, Labeling, aten
from peakcut.ir.dims.rule import Dims
from peakcut.ir.dims.shapes import names

_SUM = "sum"


def layer_norm(call: Call) -> Labeling:
    """native_layer_norm -> (out, mean, rstd): leading (batch) axes are labels."""
    x = call.shape("input")
    k = len(call.arg("normalized_shape"))
    lead = names(len(x) - k, "b")
    return Labeling({"input": lead + (None,) * k},
                    [lead + (None,) * k, lead + (None,) * k, lead + (None,) * k])


def layer_norm_backward(call: Call) -> Labeling:
    """native_layer_norm_backward -> (grad_input, grad_weight, grad_bias): weight and bias
    gradients sum over the leading axes."""
    x = call.shape("input")
    k = len(call.arg("normalized_shape"))
    lead = names(len(x) - k, "b")
    full = lead + (None,) * k
    return Labeling(
        {"grad_out": full, "input": full, "mean": full, "rstd": full},
        [full, (None,) * k, (None,) * k],
        merge=dict.fromkeys(lead, _SUM),
    )


def _batch_norm_dims(call: Call, training: bool) -> tuple[Dims, Dims]:
    """(labels of the input, labels of per-channel tensors) for a batch norm call."""
    rank = len(call.shape("input"))
    if training:
        return (None, "c") + (None,) * (rank - 2), ("c",)
    return ("n", "c", *names(rank - 2, "s")), ("c",)


def batch_norm(call: Call) -> Labeling:
    """native_batch_norm, _native_batch_norm_legit(_no_training/_functional).

    Outputs: (out, save_mean, save_invstd[, running_mean_out, running_var_out]);
    save_* are per channel in training mode and empty in eval mode (then "same").
    """
    training = bool(call.args.get("training", False))
    x, per_c = _batch_norm_dims(call, training)
    channels = call.out[1:2]
    stats = [per_c if shape == channels else None for shape in call.outputs[1:]]
    per_channel = ("weight", "bias", "running_mean", "running_var")
    tensors = {"input": x, **dict.fromkeys(per_channel, per_c)}
    return Labeling(tensors, [x, *stats])


def batch_norm_backward(call: Call) -> Labeling:
    """native_batch_norm_backward -> (grad_input, grad_weight, grad_bias).

    Training: only the channel is a label. Eval: batch and spatial axes too,
    with grad_weight/grad_bias summed over them.
    """
    train = bool(call.arg("train"))
    x, per_c = _batch_norm_dims(call, train)
    per_channel = ("weight", "running_mean", "running_var", "save_mean", "save_invstd")
    tensors = {"grad_out": x, "input": x,
               **{n: per_c for n in per_channel if _sized(call, n, call.shape("input")[1])}}
    merge = {d: _SUM for d in x if d not in (None, "c")}
    return Labeling(tensors, [x, per_c, per_c], merge=merge)


def _sized(call: Call, name: str, channels: int) -> bool:
    shape = call.optional_shape(name)
    return shape is not None and shape == (channels,)


def group_norm(call: Call) -> Labeling:
    """native_group_norm -> (out, mean [N, G], rstd [N, G]): batch "n" and whole groups "g"."""
    x = ("n", "g") + (None,) * (len(call.shape("input")) - 2)
    return Labeling({"input": x, "weight": ("g",), "bias": ("g",)}, [x, ("n", "g"), ("n", "g")],
                    sizes={"N": ("n",), "C": ("g",), "group": ("g",)})


def group_norm_backward(call: Call) -> Labeling:
    """native_group_norm_backward -> (grad_input, grad_weight, grad_bias): weight and bias
    gradients sum over the batch."""
    x = ("n", "g") + (None,) * (len(call.shape("input")) - 2)
    return Labeling(
        {"grad_out": x, "input": x, "mean": ("n", "g"), "rstd": ("n", "g"), "weight": ("g",)},
        [x, ("g",), ("g",)],
        sizes={"N": ("n",), "C": ("g",), "group": ("g",)}, merge={"n": _SUM},
    )


BUILDERS: dict[str, Builder] = {
    aten("native_layer_norm"): layer_norm,
    aten("native_layer_norm_backward"): layer_norm_backward,
    aten("native_batch_norm"): batch_norm,
    aten("native_batch_norm_backward"): batch_norm_backward,
    aten("_native_batch_norm_legit"): batch_norm,
    aten("_native_batch_norm_legit_no_training"): batch_norm,
    aten("_native_batch_norm_legit_functional"): batch_norm,
    aten("native_group_norm"): group_norm,
    aten("native_group_norm_backward"): group_norm_backward,
}
