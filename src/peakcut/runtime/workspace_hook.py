"""Workspace of a dispatched op call, for the fake tracker (same rules as the simulator)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from peakcut.memory.workspace import cpu_workspace_bytes, workspace_ops


def workspace_for_call(func: torch._ops.OpOverload, args: tuple, kwargs: dict, outputs: list) -> int:
    """Transient bytes of one call under the CPU workspace model for this process's machine
    (0 for ops without a rule)."""
    if str(func) not in workspace_ops():
        return 0

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    return int(cpu_workspace_bytes(func, tree_map(to_meta, args), tree_map(to_meta, kwargs),
                                   [to_meta(o) for o in outputs]))
