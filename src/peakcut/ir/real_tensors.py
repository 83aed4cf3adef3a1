"""Real tensors of a recorded layout, filled cheaply: what timing a call (peakcut.cost.inputs)
and probing an out overload (peakcut.codegen.arena_probe) run on.

    t = real_tensor(meta, torch.device("cpu"), generator)

A tensor is built with torch.empty_strided and the recorded shape, stride and dtype, then its
whole storage is filled: floating tensors with |randn| from the given generator, integer and
bool tensors with zeros (always-valid indices, all-false masks). A floating tensor draws
RANDOM_BLOCK values and repeats them: what a call allocates does not depend on the values,
nor (away from NaNs) how long it runs, and drawing every value cost 14 s of the 17 s that
calibrating paper-size GPT-Neo's workspace took (3.5 ns an element). The data is made
non-negative because sqrt / log / rsqrt / pow of negative numbers produce NaNs, and NaNs take
slow paths in the vectorized math library (sqrt on NaNs is ~25x slower on an AVX-512 CPU),
which real training data never hits.
"""

from __future__ import annotations

import torch

from peakcut.ir.tensor import TensorMeta

INPUT_SEED = 0
"""The seed of the generators real tensors are drawn from."""
RANDOM_BLOCK = 1 << 16
"""Values drawn per floating tensor; a larger tensor repeats them (module docstring)."""


def real_tensor(meta: TensorMeta, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """A tensor with `meta`'s layout on `device`, filled as described in the module docstring."""
    t = torch.empty_strided(meta.shape, meta.stride, dtype=meta.torch_dtype, device=device)
    elements = t.untyped_storage().nbytes() // t.element_size()
    flat = t.as_strided((elements,), (1,), 0)
    if t.is_floating_point() or t.is_complex():
        block = flat[:min(elements, RANDOM_BLOCK)]
        block.normal_(generator=generator)
        if t.is_floating_point():
            block.abs_()
        done = block.numel()
        while done < elements:               # the block repeated, doubling what is filled
            k = min(done, elements - done)
            flat[done:done + k].copy_(flat[:k])
            done += k
    else:
        flat.zero_()
    return t
