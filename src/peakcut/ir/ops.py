"""peakcut's own ops: the copies between device and host memory, registered with PyTorch.

`peakcut::store(x)` copies a device tensor to host memory (swap-out),
`peakcut::load(host, device)` copies a host tensor to the device (swap-in, or bringing in a
program input that lives in host memory between steps), `peakcut::writeback(host, x)`
copies a device tensor into an existing host tensor in place (a host-resident input's new
value, e.g. offloaded optimizer state after its update) and `peakcut::upload(device, x)`
copies a host tensor into an existing device tensor in place (a parameter's new value from an
update that ran on the host). They are real
`torch.library` custom ops, so graphs holding them resolve, re-derive shapes
under FakeTensors and run eagerly like any ATen op. Generated programs do not
call them: codegen emits the side-stream copies directly (see
peakcut.codegen.swap), but these eager versions give the same numbers.

All keep the tensor's strides, so the caller must only swap tensors that are
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


WRITEBACK_OP = "peakcut.writeback.default"


@torch.library.custom_op("peakcut::writeback", mutates_args=("host",))
def writeback(host: torch.Tensor, x: torch.Tensor) -> None:
    """Copy `x` into the host tensor `host` (same shape and dtype), in place."""
    host.copy_(x)


@writeback.register_fake
def _writeback_fake(host: torch.Tensor, x: torch.Tensor) -> None:
    return None


UPLOAD_OP = "peakcut.upload.default"


@torch.library.custom_op("peakcut::upload", mutates_args=("device",))
def upload(device: torch.Tensor, x: torch.Tensor) -> None:
    """Copy the host tensor `x` into the device tensor `device` (same shape and dtype), in
    place: a parameter's new value, computed by an update on the host, back where it lives."""
    device.copy_(x)


@upload.register_fake
def _upload_fake(device: torch.Tensor, x: torch.Tensor) -> None:
    return None


COPY_DIRECTION = {STORE_OP: "d2h", LOAD_OP: "h2d", WRITEBACK_OP: "d2h", UPLOAD_OP: "h2d"}
"""The host copy ops and the way each copies ("d2h": device to host, "h2d": host to device)."""


def is_swap_op(op: str) -> bool:
    """A swap's store or load (the swap rule's own pair)."""
    return op in (STORE_OP, LOAD_OP)


def is_host_copy(op: str) -> bool:
    """A copy between device and host memory: store, load or writeback (copy streams)."""
    return op in COPY_DIRECTION


def copied_argument(op: str) -> int:
    """Position of the argument whose bytes a host copy op moves (writeback, upload: its source)."""
    return 1 if op in (WRITEBACK_OP, UPLOAD_OP) else 0


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


RNG_STATE_OP = "peakcut.rng_state.default"
SET_RNG_STATE_OP = "peakcut.set_rng_state.default"


def _generator(device: torch.device) -> torch.Generator:
    """`device`'s default random generator (read directly: torch.get_rng_state may be
    patched while a step is traced, capture.rng)."""
    if device.type == "cpu":
        return torch.default_generator
    module = torch.get_device_module(device.type)
    module.init()
    index = device.index if device.index is not None else module.current_device()
    generator: torch.Generator = module.default_generators[index]
    return generator


@torch.library.custom_op("peakcut::rng_state", mutates_args=())
def rng_state(device: torch.device) -> torch.Tensor:
    """A copy of the state of `device`'s default random generator (a host uint8 tensor), as
    torch.get_rng_state / torch.cuda.get_rng_state return it."""
    return _generator(device).get_state()


@rng_state.register_fake
def _rng_state_fake(device: torch.device) -> torch.Tensor:
    return torch.empty(_generator(device).get_state().numel(), dtype=torch.uint8, device=HOST_DEVICE)


@torch.library.custom_op("peakcut::set_rng_state", mutates_args=())
def set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    """Set `device`'s default random generator to `state` (from peakcut::rng_state): what
    torch.utils.checkpoint does before it recomputes, so the recompute draws the forward's
    random numbers."""
    _generator(device).set_state(state)


@set_rng_state.register_fake
def _set_rng_state_fake(state: torch.Tensor, device: torch.device) -> None:
    return None


RNG_STATE_OPS = (RNG_STATE_OP, SET_RNG_STATE_OP)
"""The ops that read or set a random generator's state: they keep their order among the
calls that draw random numbers (ir.registry.draws_random) and are never split or duplicated."""
