"""Known disagreements between fake (meta) kernels and the real ones, per device type.

A few kernels choose an output dtype apart from their inputs' in a way the fake kernel
does not reproduce: on CPU, native_layer_norm / group_norm / batch_norm of a bf16 input
with fp32 weight (what bf16 autocast makes) return fp32 statistics, and
native_group_norm_backward returns a bf16 input gradient there. Capture fixes the graph
(capture.realcheck, which also runs the real kernels); code that re-runs graph ops over
FakeTensors (Graph.check, fission's part layouts, TASO's run_fake) calls
`with_real_dtypes` on the results so it sees what really runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_REDUCED = (torch.bfloat16, torch.float16)
Dtypes = tuple[torch.dtype | None, ...]


# ------------------------------------------------------------------ the known table
def _mixed(dtypes: Sequence[torch.dtype | None], x: int, params: Sequence[int]) -> bool:
    """The CPU kernels' is_mixed_type: a bf16/fp16 input with fp32 weight/bias/statistics."""
    if x >= len(dtypes) or dtypes[x] not in _REDUCED:
        return False
    return any(i < len(dtypes) and dtypes[i] == torch.float32 for i in params)


def _stats_fp32(x: int, params: Sequence[int], outs: Sequence[int]) -> Callable[[Sequence[Any], Dtypes], Dtypes | None]:
    def rule(args: Sequence[Any], fake: Dtypes) -> Dtypes | None:
        if not _mixed(args, x, params):
            return None
        return tuple(torch.float32 if i in outs and d is not None else d for i, d in enumerate(fake))
    return rule


def _grad_input_like_input(x: int, params: Sequence[int]) -> Callable[[Sequence[Any], Dtypes], Dtypes | None]:
    def rule(args: Sequence[Any], fake: Dtypes) -> Dtypes | None:
        if not _mixed(args, x, params) or not fake or fake[0] is None:
            return None
        return (args[x], *fake[1:])
    return rule


# device type -> op -> rule(dtypes of the positional arguments (None: not a tensor), fake
# output dtypes) -> real output dtypes, or None when the rule does not apply. Checked against
# the real kernels by tests/capture/test_real_metadata.py.
KNOWN: dict[str, dict[str, Callable[[Sequence[Any], Dtypes], Dtypes | None]]] = {
    "cpu": {
        "aten.native_layer_norm.default": _stats_fp32(0, (2, 3), (1, 2)),
        "aten.native_group_norm.default": _stats_fp32(0, (1, 2), (1, 2)),
        "aten.native_batch_norm.default": _stats_fp32(0, (1, 2, 3, 4), (1, 2)),
        "aten._native_batch_norm_legit.default": _stats_fp32(0, (1, 2, 3, 4), (1, 2)),
        "aten._native_batch_norm_legit.no_stats": _stats_fp32(0, (1, 2), (1, 2)),
        "aten._native_batch_norm_legit_no_training.default": _stats_fp32(0, (1, 2, 3, 4), (1, 2)),
        "aten._native_batch_norm_legit_functional.default": _stats_fp32(0, (1, 2, 3, 4), (1, 2, 3, 4)),
        "aten.native_group_norm_backward.default": _grad_input_like_input(1, (2, 3, 4)),
    },
}


def known_real_dtypes(op: str, arg_dtypes: Sequence[torch.dtype | None], fake: Dtypes,
                      device_type: str) -> Dtypes | None:
    """What the real kernel returns where KNOWN says the fake kernel is wrong, else None.

    arg_dtypes: the dtype of each positional argument (None for non-tensors); fake: the
    fake kernel's output dtypes. Usable by any code that re-runs ops over FakeTensors.
    """
    rule = KNOWN.get(device_type, {}).get(op)
    if rule is None:
        return None
    real = rule(arg_dtypes, fake)
    return None if real is None or tuple(real) == tuple(fake) else tuple(real)


def real_call_dtypes(op: str, args: Sequence[Any], results: Sequence[Any], device_type: str) -> Dtypes:
    """The dtypes a call's outputs really have, from the fake kernel's `results` for the
    positional `args` (tensors or not), KNOWN applied: for code that re-runs graph ops over
    FakeTensors and compares with the graph's metadata."""
    fake = _dtypes(results)
    arg_dtypes = [a.dtype if isinstance(a, torch.Tensor) else None for a in args]
    return known_real_dtypes(op, arg_dtypes, fake, device_type) or fake




def _dtypes(values: Sequence[Any]) -> Dtypes:
    return tuple(v.dtype if isinstance(v, torch.Tensor) else None for v in values)


def with_real_dtypes(op: str, args: Sequence[Any], result: Any, device_type: str) -> Any:
    """`result` of a fake run of `op` on `args`, with outputs KNOWN to really have another
    dtype replaced by empty tensors of that dtype (same shape and strides; created in the
    ambient fake mode)."""
    if op not in KNOWN.get(device_type, {}):
        return result                       # the common case: fission expands many nodes
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    real = real_call_dtypes(op, args, results, device_type)
    if tuple(real) == _dtypes(results):
        return result
    fixed = [torch.empty_strided(r.shape, r.stride(), dtype=d, device=r.device)
             if isinstance(r, torch.Tensor) and d is not None and d != r.dtype else r
             for r, d in zip(results, real, strict=True)]
    return type(result)(fixed) if isinstance(result, (tuple, list)) else fixed[0]
