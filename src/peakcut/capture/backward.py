"""The traced backward: the loss's gradients with respect to the trainable parameters.

`torch.autograd.grad` computes them without touching `.grad`. A model that runs blocks under
`torch.utils.checkpoint(..., use_reentrant=True)` cannot be differentiated that way (the
reentrant checkpoint's backward calls `torch.autograd.backward` itself, which PyTorch refuses
inside `.grad()`), so such a step runs `loss.backward()` and reads the gradients from `.grad`
of the traced parameters, as the user's own loop does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

REENTRANT_CHECKPOINT = "CheckpointFunctionBackward"
"""The autograd node of torch.utils.checkpoint's reentrant mode."""


def has_reentrant_checkpoint(loss: torch.Tensor) -> bool:
    """Whether the loss's autograd graph holds a reentrant checkpoint."""
    seen: set[int] = set()
    todo = [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if type(fn).__name__ == REENTRANT_CHECKPOINT:
            return True
        todo.extend(f for f, _ in fn.next_functions)
    return False


def gradients(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """d loss / d params (None for a parameter the loss does not reach)."""
    if not has_reentrant_checkpoint(loss):
        return torch.autograd.grad(loss, params, allow_unused=True)
    for p in params:
        p.grad = None
    loss.backward()
    return tuple(p.grad for p in params)
