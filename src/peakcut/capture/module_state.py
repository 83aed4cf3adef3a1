"""The user's modules as they were before capture: tensors a forward stores on them are undone.

A forward may store tensors on its module as it runs: a mask or position table made on the
first call and kept (`self.mask = torch.ones(t, t).tril()`), a buffer registered on the fly
(`self.register_buffer("pos", ...)`), a cache refreshed when the shape changes. Under
capture that forward runs on FakeTensors, so the module would keep a FakeTensor, and the
user's next eager call would fail on it. `tensors_restored` puts every tensor attribute,
buffer and parameter of every submodule back as it was (and removes the ones the trace
added); the captured step makes such tensors in its own graph at every step, as the
forward does when it finds none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_TABLES = ("_parameters", "_buffers")


def _tensor_entries(table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if isinstance(v, torch.Tensor)}


def _restore(table: dict[str, Any], before: dict[str, Any], everything: dict[str, Any]) -> None:
    """Tensor entries of `table` back to `before`; entries added since (tensors) removed.
    `everything`: the table's whole contents before, so a tensor that replaced a non-tensor
    value gets that value back."""
    for key, value in list(table.items()):
        if isinstance(value, torch.Tensor) and key not in before:
            if key in everything:
                table[key] = everything[key]
            else:
                del table[key]
    for key, value in before.items():
        if table.get(key) is not value:
            table[key] = value


@contextmanager
def tensors_restored(model: torch.nn.Module) -> Iterator[None]:
    """Undo, on exit, what the block did to the tensors held by `model`'s submodules."""
    saved = []
    for module in model.modules():
        attrs = vars(module)
        tables = {name: dict(attrs[name]) for name in _TABLES if name in attrs}
        saved.append((module, dict(attrs), tables))
    try:
        yield
    finally:
        for module, attrs_before, tables in saved:
            attrs = vars(module)
            _restore(attrs, _tensor_entries(attrs_before), attrs_before)
            for name, table_before in tables.items():
                _restore(attrs[name], table_before, table_before)
