"""peakcut's own ops: the two halves of a swap, registered with PyTorch.

`peakcut::store(x)` copies a device tensor to host memory (swap-out) and
`peakcut::load(host, device)` copies it back (swap-in). They are real
`torch.library` custom ops, so graphs holding them resolve, re-derive shapes
under FakeTensors and run eagerly like any ATen op. Generated programs do not
call them: codegen emits the side-stream copies directly (see
peakcut.codegen.swap), but these eager versions give the same numbers.

Both keep the tensor's strides, so the caller must only swap tensors that are
non-overlapping and dense (see peakcut.transform.swap).
"""

from __future__ import annotations

import torch

STORE_OP = "peakcut.store.default"
LOAD_OP = "peakcut.load.default"
HOST_DEVICE = "cpu"


@torch.library.custom_op("peakcut::store", mutates_args=())
def store(x: torch.Tensor) -> torch.Tensor:
    """A host copy of `x` with the same strides."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=HOST_DEVICE)
    out.copy_(x)
    return out


@store.register_fake
def _store_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=HOST_DEVICE)


@torch.library.custom_op("peakcut::load", mutates_args=())
def load(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A device copy of the host tensor `host`, with the same strides."""
    out = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
    out.copy_(host)
    return out


@load.register_fake
def _load_fake(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)


def is_swap_op(op: str) -> bool:
    return op in (STORE_OP, LOAD_OP)


GATE_OP = "peakcut.skip_update_if.default"


@torch.library.custom_op("peakcut::skip_update_if", mutates_args=())
def skip_update_if(found_inf: torch.Tensor) -> None:
    """Marks where a GradScaler step decides to skip its update (found_inf != 0).

    Eagerly it does nothing; capture orders every write of a parameter or of optimizer
    state after it, and codegen emits it as an early return of the step.
    """


@skip_update_if.register_fake
def _skip_update_if_fake(found_inf: torch.Tensor) -> None:
    return None
