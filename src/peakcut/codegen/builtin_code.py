"""The code hooks of the nodes peakcut's own transformations add, in the order their lines come:
swaps, recomputes, host-kept optimizer state, host-kept parameters, updates on the host; then
the list calls of torch.optim's foreach and fused updates (capture's runs of per-tensor
nodes). Each hook finds its nodes by their ops and tags (codegen.hooks)."""

from __future__ import annotations

from peakcut.codegen.foreach_code import ForeachHook
from peakcut.codegen.hooks import CodeHook
from peakcut.codegen.host_update_code import HostUpdateHook
from peakcut.codegen.input_copy_code import InputCopyHook
from peakcut.codegen.recompute_code import RecomputeHook
from peakcut.codegen.swap_code import SwapHook
from peakcut.ir.tensor import Role

BUILTIN_HOOKS: tuple[CodeHook, ...] = (
    SwapHook(),
    RecomputeHook(),
    InputCopyHook(Role.OPT_STATE),
    InputCopyHook(Role.PARAM),
    HostUpdateHook(),
    ForeachHook(),
)
"""Every hook codegen applies to every program, before a caller's own."""
