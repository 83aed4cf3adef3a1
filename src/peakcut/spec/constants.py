"""The `const:` inputs of a step: how their names bind to the user's tensors at every call.

Capture lifts a tensor the step reads that is neither a parameter, a buffer nor the batch
as an input named `const:<key>` (capture.constants); the step binds it to the user's tensor
object at every call (`resolve`), so in-place changes on either side are seen, as in eager:

- `const:attr:<path>`: an attribute of the model the step is called with;
- `const:global:<python module>:<path>`: a global of a module (or an attribute of one);
- `const:held:<label>`: a tensor in this process's table of held tensors (`hold`), weakly
  held: the table never keeps a tensor alive, and such a step runs in the process that
  captured it.
"""

from __future__ import annotations

import sys
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

import torch

PREFIX = "const:"

# label -> the tensor a `const:held:<label>` input binds to. Graphs cross processes (the
# search's workers) and JSON files, so a graph names its constants; this table holds the
# tensors that no attribute or module path reaches. Weak: it never keeps a tensor alive.
_HELD: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()


def hold(label: str, t: torch.Tensor, taken: set[str]) -> str:
    """A key for `t` in the table of held tensors: `label` and a token of its own, so that a
    graph whose tensor is gone never binds another capture's tensor of the same label."""
    key = f"{label}@{uuid.uuid4().hex[:8]}"
    while key in _HELD or f"{PREFIX}held:{key}" in taken:
        key = f"{label}@{uuid.uuid4().hex[:8]}"
    _HELD[key] = t
    return key


def resolve(key: str, model: torch.nn.Module) -> torch.Tensor:
    """The tensor a `const:<key>` input binds to for `model`; LookupError naming it when
    there is none."""
    kind, _, rest = key.partition(":")
    where: Any
    if kind == "attr":
        where, path = model, rest
    elif kind == "global":
        module, _, path = rest.partition(":")
        where = sys.modules.get(module)
        if where is None:
            raise LookupError(f"constant {PREFIX}{key}: module {module!r} is not imported")
    elif kind == "held":
        found = _HELD.get(rest)
        if found is None:
            raise LookupError(f"constant {PREFIX}{key}: the tensor the step was captured with is gone (a closure "
                              "variable of loss_fn is bound only in the process that captured it, while the tensor "
                              "lives): plan again")
        return found
    else:
        raise LookupError(f"constant {PREFIX}{key}: unknown kind {kind!r}")
    for part in path.split("."):
        where = getattr(where, part, None)
    if not isinstance(where, torch.Tensor):
        raise LookupError(f"constant {PREFIX}{key}: {path!r} is no longer a tensor ({type(where).__name__})")
    return where


def bound_constants(input_names: Iterable[str], model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(input name, tensor) of each `const:` input among `input_names` that binds for `model`
    now (those that do not are left out: binding the step names them)."""
    found = []
    for name in input_names:
        if name.startswith(PREFIX):
            try:
                found.append((name, resolve(name.removeprefix(PREFIX), model)))
            except LookupError:
                continue
    return found


def held(input_names: list[str]) -> list[torch.Tensor]:
    """The tensors that the `const:held:` inputs among `input_names` bind to, where they are
    still alive: a step or plan keeps them, so they live as long as it does."""
    keys = [n.removeprefix(PREFIX + "held:") for n in input_names if n.startswith(PREFIX + "held:")]
    return [t for k in keys if (t := _HELD.get(k)) is not None]
