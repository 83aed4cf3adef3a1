"""The user's modules as they were before capture: tensors a forward stores on them are undone.

A forward may store tensors on its module as it runs: a mask or position table made on the
first call and kept (`self.mask = torch.ones(t, t).tril()`), a buffer registered on the fly
(`self.register_buffer("pos", ...)`), a cache refreshed when the shape changes. Under
capture that forward runs on FakeTensors, so the module would keep a FakeTensor, and the
user's next eager call would fail on it. `tensors_restored` puts every tensor attribute,
buffer and parameter of every submodule back as it was (and removes the ones the trace
added), and a dict or list attribute that came to hold a FakeTensor (a cache) back to its
contents; the captured step makes such tensors in its own graph at every step, as the
forward does when it finds none. A registered buffer the forward assigns a new tensor to
keeps the new value, written into the buffer in place (`persist_rebound_buffers`), as eager
keeps it for the next step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from peakcut.capture.errors import CaptureError

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


def _holds_fake(value: Any, depth: int = 2) -> bool:
    """Whether `value` is a FakeTensor or holds one in a dict, list or tuple (`depth` levels)."""
    if isinstance(value, FakeTensor):
        return True
    if depth == 0:
        return False
    if isinstance(value, dict):
        return any(_holds_fake(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_fake(v, depth - 1) for v in value)
    return False


def _restore_containers(attrs: dict[str, Any], before: dict[str, Any], contents: dict[str, Any]) -> None:
    """A dict or list attribute that now holds a FakeTensor gets back its object and contents."""
    for key, value in list(attrs.items()):
        if not _holds_fake(value):
            continue
        if key not in before:
            del attrs[key]
            continue
        attrs[key] = old = before[key]
        if key in contents:
            old.clear()
            old.update(contents[key]) if isinstance(old, dict) else old.extend(contents[key])


@contextmanager
def tensors_restored(model: torch.nn.Module) -> Iterator[None]:
    """Undo, on exit, what the block did to the tensors held by `model`'s submodules (in
    attributes, buffers, parameters, and dicts and lists kept as attributes: a cache)."""
    saved = []
    for module in model.modules():
        attrs = vars(module)
        tables = {name: dict(attrs[name]) for name in _TABLES if name in attrs}
        contents = {k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in attrs.items()
                    if isinstance(v, (dict, list)) and k not in _TABLES and not k.startswith("_")}
        saved.append((module, dict(attrs), tables, contents))
    try:
        yield
    finally:
        for module, attrs_before, tables, contents in saved:
            attrs = vars(module)
            _restore(attrs, _tensor_entries(attrs_before), attrs_before)
            _restore_containers(attrs, attrs_before, contents)
            for name, table_before in tables.items():
                _restore(attrs[name], table_before, table_before)


def persist_rebound_buffers(model: torch.nn.Module, traced: dict[str, torch.Tensor]) -> None:
    """A buffer the forward assigned a new tensor to (`self.ema = 0.99 * self.ema + ...`) gets
    that tensor's value written into it, in place, as the step's own op: eager keeps the new
    value for the next step, and a captured step keeps it in the buffer's storage. `traced`
    maps each buffer's name to the tensor the trace bound it to. A new tensor of another
    shape, dtype or device cannot be kept in place: CaptureError naming the buffer."""
    for name, tensor in model.named_buffers(remove_duplicate=False):
        old = traced.get(name)
        if old is None or tensor is old:
            continue
        if tensor.shape != old.shape or tensor.dtype != old.dtype or tensor.device != old.device:
            path, _, leaf = name.rpartition(".")
            where = f"module '{path}' ({type(model.get_submodule(path)).__name__})" if path else "the model"
            raise CaptureError(
                f"{where} assigns its buffer '{leaf}' a tensor of another shape, dtype or device while the step "
                f"runs ({tuple(old.shape)} {old.dtype} -> {tuple(tensor.shape)} {tensor.dtype}): a captured step "
                "keeps a buffer in its own storage; register it at its final shape")
        with torch.no_grad():
            old.copy_(tensor)
