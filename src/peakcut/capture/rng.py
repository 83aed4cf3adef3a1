"""Random generator state as part of the captured step.

A step that saves a generator's state and sets it back later draws the same random
numbers twice: `torch.utils.checkpoint` (both modes, with its default preserve_rng_state)
stashes the state before a checkpointed forward and restores it around the recompute in
the backward, so the recompute's dropout masks are the forward's; `torch.random.fork_rng`
and user code that calls `torch.get_rng_state` / `torch.set_rng_state` do the same. Under
make_fx those calls act on the real generator and leave no trace, so a captured step would
draw fresh masks in the recompute. While a step is traced, `traced_rng_state` routes them
through peakcut's own ops (`peakcut::rng_state`, `peakcut::set_rng_state`, ir.ops), which
the graph keeps in order with every random draw (capture chains them), and which the
generated program runs as the eager step does.

`torch.manual_seed` and `torch.seed` (and an accelerator's `manual_seed`, `manual_seed_all`,
`seed`, `seed_all`) inside a traced step are refused: a seed set at every step would repeat
the same numbers step after step in the captured program, which is rarely what the user
meant, and peakcut cannot tell. Any other change of a generator's state while the step is
traced (`torch.default_generator.set_state(...)`, a generator's `manual_seed`) would happen
once, at capture, and not in the captured step: the state is compared before and after the
trace, put back, and the change refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

import peakcut.ir.ops  # noqa: F401 - registers the peakcut ops the traced calls record
from peakcut.capture.errors import CaptureError


def _device_of(device: Any, device_type: str) -> torch.device:
    """The device a device module's get/set_rng_state call names ('cuda', 0, 'cuda:1')."""
    if isinstance(device, int):
        return torch.device(device_type, device)
    dev = torch.device(device)
    if dev.index is None:
        return torch.device(device_type, torch.get_device_module(device_type).current_device())
    return dev


def _get_cpu() -> torch.Tensor:
    return torch.ops.peakcut.rng_state(torch.device("cpu"))


def _set_cpu(new_state: torch.Tensor) -> None:
    torch.ops.peakcut.set_rng_state(new_state, torch.device("cpu"))


def _refuse_seed(*_args: Any, **_kwargs: Any) -> Any:
    raise CaptureError("the step calls torch.manual_seed (or torch.seed, or an accelerator's manual_seed) "
                       "while it runs: a captured step "
                       "would set the same seed at every step; seed the generator once, outside the "
                       "model and loss_fn")


@contextmanager
def traced_rng_state(device: torch.device) -> Iterator[None]:
    """While open, torch.get_rng_state / set_rng_state (and, for a step on `device`'s
    accelerator, its device module's) record peakcut's generator-state ops in the trace."""
    with ExitStack() as stack:
        def patch(owner: Any, name: str, value: Any) -> None:
            stack.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, value)

        for owner in (torch, torch.random):
            patch(owner, "get_rng_state", _get_cpu)
            patch(owner, "set_rng_state", _set_cpu)
            patch(owner, "manual_seed", _refuse_seed)
            patch(owner, "seed", _refuse_seed)
        if device.type != "cpu":
            kind = device.type
            module = torch.get_device_module(kind)

            def get_device(device: Any = kind) -> torch.Tensor:
                return torch.ops.peakcut.rng_state(_device_of(device, kind))

            def set_device(new_state: torch.Tensor, device: Any = kind) -> None:
                torch.ops.peakcut.set_rng_state(new_state, _device_of(device, kind))

            patch(module, "get_rng_state", get_device)
            patch(module, "set_rng_state", set_device)
            for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
                if hasattr(module, name):
                    patch(module, name, _refuse_seed)
        generators = _default_generators(device)
        before = [g.get_state() for g in generators]
        yield
        changed = [g for g, state in zip(generators, before, strict=True) if not torch.equal(g.get_state(), state)]
        for g, state in zip(generators, before, strict=True):
            g.set_state(state)
        if changed:
            raise CaptureError(f"the step changes the state of {changed[0].device}'s random generator through a call "
                               "peakcut does not trace (torch.default_generator.set_state, a generator's "
                               "manual_seed, ...): the change would happen once, at capture; save and restore "
                               "the state with torch.get_rng_state / torch.set_rng_state (or "
                               "torch.random.fork_rng), which a captured step repeats")


def _default_generators(device: torch.device) -> list[torch.Generator]:
    """The default generators a step on `device` may draw from: the CPU's, and the
    accelerator's where it is initialized."""
    found = [torch.default_generator]
    if device.type != "cpu":
        module = torch.get_device_module(device.type)
        if getattr(module, "is_initialized", lambda: False)():
            found.extend(module.default_generators)
    return found
