"""How the generated step receives its inputs: four mappings, keyed by name.

    step(params, buffers, state, batch, *, device, ...)

- params: the parameters ("param:<name>" inputs) by <name>;
- buffers: the buffers ("buffer:<name>") by <name>, and the tensors the forward closes over
  ("const:<key>") by their whole input name;
- state: the optimizer state ("state:<param>.<slot>") by "<param>.<slot>", and the gradients
  accumulated across micro-batches ("acc:<param>") and the GradScaler's scale ("scaler:scale")
  by their whole input names;
- batch: the batch's tensors ("batch:<i>", the i-th leaf in pytree order) by i.

The step binds each input to a local right before its first use; the caller's mappings hold
the inputs for the whole call, as a caller's list of positional arguments would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

GROUPS = ("params", "buffers", "state", "batch")
"""The step's positional parameters, in order."""

_OWN = {"param": "params", "buffer": "buffers", "state": "state", "batch": "batch"}
_BESIDE = {"const": "buffers", "acc": "state", "scaler": "state"}


def input_slot(name: str) -> tuple[str, str | int]:
    """(the mapping, its key) of program input `name`; an input of another kind goes to batch
    under its whole name."""
    kind, _, rest = name.partition(":")
    if kind == "batch" and rest.isdigit():
        return "batch", int(rest)
    if kind in _OWN and kind != "batch":
        return _OWN[kind], rest
    return _BESIDE.get(kind, "batch"), name


def check_slots(names: Iterable[str]) -> list[tuple[str, str | int]]:
    """The slot of each input name; ValueError when two inputs would share one."""
    slots = [input_slot(n) for n in names]
    if len(set(slots)) != len(slots):
        twice = next(s for s in slots if slots.count(s) > 1)
        raise ValueError(f"two program inputs would be {twice[0]}[{twice[1]!r}]")
    return slots


def input_mappings(slots: Sequence[tuple[str, str | int]], values: Sequence[Any]) -> list[dict[Any, Any]]:
    """The step's positional arguments (GROUPS order) for input values in program order."""
    out: dict[str, dict[Any, Any]] = {group: {} for group in GROUPS}
    for (group, key), value in zip(slots, values, strict=True):
        out[group][key] = value
    return [out[group] for group in GROUPS]
