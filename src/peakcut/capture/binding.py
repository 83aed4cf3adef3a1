"""The model as a traced loss_fn sees it: the user's module called with traced parameters and buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module

from peakcut.capture.module_state import persist_rebound_buffers


class BoundModel:
    """The model as a traced loss_fn sees it: calls `model` with substituted parameters and
    buffers (as torch.func.functional_call does) and forwards attribute reads to it. A buffer
    named in `buffers` that the forward assigns a new tensor to gets its value in place."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor], buffers: Sequence[str] = ()) -> None:
        self._model = model
        self._state = state
        self._buffers = {n: state[n] for n in buffers}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _reparametrize_module(self._model, self._state, tie_weights=True, strict=False):
            out = self._model(*args, **kwargs)
            persist_rebound_buffers(self._model, self._buffers)    # `self.ema = ...` kept, in place
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
