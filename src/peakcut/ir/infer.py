"""Output layouts of an op call, from running it on FakeTensors laid out like a graph's tensors.

Every storage of the graph gets one fake storage (a uint8 FakeTensor of its bytes, rounded up
to a multiple of 16 so that any dtype can view it) and every
input is a strided view of its storage's, so inputs that share a storage share a fake one.
An output whose fake storage is an input's lives in that input's storage (a view, an in-place
result: the real storage identity, as capture takes it); any other output gets a fresh
storage of the bytes its fake storage holds. A layout is

    (shape, stride, dtype, storage offset, source)

with source ("in", storage id) or ("fresh", i, nbytes) for the call's i-th new storage.

Runs are memoized by what the layouts can depend on (LayoutMemo, see memo_key): the op, its
arguments with tensors as input positions, and per input its layout, storage size and the
first input sharing its storage. Parts of a fission region and repeated layers make the same
calls; a memo can be shared by every inference of graphs of one device (its entries are pure
functions of their keys). Dtypes are the real kernels' (peakcut.ir.real_dtypes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef, iter_refs, map_refs
from peakcut.ir.real_dtypes import with_real_dtypes
from peakcut.ir.registry import resolve_op

Source = tuple[Any, ...]
"""("in", storage id): an input's storage; ("fresh", i, nbytes): the call's i-th new storage
(("in", i) with i an input position inside a memo entry)."""

Layout = tuple[tuple[int, ...], tuple[int, ...], str, int, Source]
"""An output of an op call: shape, stride, dtype, storage offset and storage (Source)."""

LayoutMemo = dict[tuple[Any, ...], list[Layout | None]]
"""memo_key(...) -> the layouts of that call with input storages as input positions."""

FAILURES = (RuntimeError, NotImplementedError, ValueError, TypeError, IndexError)
"""What an op (or resolving it) raises on inputs it rejects."""

_UNMEMOIZED = ("resize", "set_")
"""Ops (by name; also every out= overload) whose fake run could change an input's storage."""

_PLAIN = (bool, int, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


class InferenceError(Exception):
    """The op failed on FakeTensors of its inputs (or is unknown to PyTorch); `cause` says how."""

    def __init__(self, op: str, cause: BaseException) -> None:
        super().__init__(f"{op}: {cause}")
        self.op = op
        self.cause = cause


class FakeStorages:
    """One fake storage per storage of a graph, and the call runner over them (module doc).

    A fake storage is made at its first use with the graph's size for that storage; forget()
    it when the storage is resized or removed.
    """

    def __init__(self, memo: LayoutMemo | None = None) -> None:
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.memo: LayoutMemo = {} if memo is None else memo
        self._bases: dict[int, torch.Tensor] = {}   # storage id -> fake uint8 tensor spanning it

    def forget(self, storage: int) -> None:
        self._bases.pop(storage, None)

    def _fake_of(self, g: Graph, tid: int) -> torch.Tensor:
        """A FakeTensor with the tensor's layout in the fake storage of its storage."""
        meta = g.tensors[tid]
        base = self._bases.get(meta.storage)
        if base is None:
            nbytes = g.storages[meta.storage]   # rounded up: any dtype can view it
            base = torch.empty(nbytes + (-nbytes) % 16, dtype=torch.uint8, device=g.device)
            self._bases[meta.storage] = base
        return base.view(meta.torch_dtype).as_strided(meta.shape, meta.stride, meta.storage_offset)

    def layouts(self, g: Graph, op: str, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> list[Layout | None]:
        """Per output of the call (None where it returns no tensor): its layout (module doc).
        Raises InferenceError when the op fails on the inputs."""
        inputs = input_ids(args, kwargs)
        key = memo_key(g, op, args, kwargs, inputs)
        if key is not None:
            cached = self.memo.get(key)
            if cached is not None:
                return [_rebind(layout, g, inputs) for layout in cached]
        with self.mode:
            fakes = {t: self._fake_of(g, t) for t in inputs}
            try:
                fake_args = map_refs(args, lambda r: fakes[r.id])
                result = with_real_dtypes(op, fake_args, resolve_op(op)(*fake_args, **map_refs(
                    kwargs, lambda r: fakes[r.id])), torch.device(g.device).type)
            except FAILURES as e:
                raise InferenceError(op, e) from None
        known = {_storage_key(self._bases[g.tensors[t].storage]): i
                 for i, t in reversed(list(enumerate(inputs)))}   # the first input of a storage
        fresh: dict[StorageWeakRef, int] = {}
        generic: list[Layout | None] = []
        for r in list(result) if isinstance(result, (tuple, list)) else [result]:
            if not isinstance(r, torch.Tensor):
                generic.append(None)
                continue
            ref = _storage_key(r)
            if ref in known:
                source: Source = ("in", known[ref])
            else:
                index = fresh.setdefault(ref, len(fresh))
                source = ("fresh", index, int(r.untyped_storage().nbytes()))
            generic.append((tuple(int(s) for s in r.shape), tuple(int(s) for s in r.stride()),
                            str(r.dtype).removeprefix("torch."), int(r.storage_offset()), source))
        if key is not None:
            self.memo[key] = generic
        return [_rebind(layout, g, inputs) for layout in generic]


def _storage_key(t: torch.Tensor) -> StorageWeakRef:
    """What tells t's storage from others (equal for tensors sharing one)."""
    return StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call]


def input_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """The tensor ids an op call reads, in argument order, without repeats (Node.input_ids)."""
    seen = dict.fromkeys(ref.id for ref in iter_refs(args))
    seen.update(dict.fromkeys(ref.id for ref in iter_refs(kwargs)))
    return list(seen)


def memo_key(g: Graph, op: str, args: tuple[Any, ...], kwargs: dict[str, Any],
             inputs: Sequence[int]) -> tuple[Any, ...] | None:
    """What the output layouts of an op call can depend on, or None (never memoized).

    The op, its arguments with each tensor replaced by its position among the inputs (scalars
    tagged with their type: 1, 1.0 and True differ), and per input its shape, stride, dtype,
    storage offset, storage size and the first input sharing its storage. Runs of the same
    key on FakeTensors give the same outputs up to the renaming of input storages.
    """
    parts = op.split(".")
    if len(parts) != 3 or parts[2].startswith("out") or any(w in parts[1] for w in _UNMEMOIZED):
        return None
    position = {t: i for i, t in enumerate(inputs)}
    first: dict[int, int] = {}
    layouts = []
    for i, t in enumerate(inputs):
        meta = g.tensors[t]
        layouts.append((meta.shape, meta.stride, meta.dtype, meta.storage_offset,
                        g.storages[meta.storage], first.setdefault(meta.storage, i)))
    try:
        encoded = encode(args, position), encode(kwargs, position)
    except Unhashable:
        return None
    return op, *encoded, tuple(layouts)


class Unhashable(Exception):
    """An argument a key cannot represent exactly."""


def encode(value: Any, position: Mapping[int, int]) -> Any:
    """value as a hashable key: type-tagged, TensorRefs as input positions (see memo_key);
    raises Unhashable for a value it cannot represent exactly."""
    if isinstance(value, TensorRef):
        return ("ref", position[value.id])
    kind = type(value)
    if kind is float:
        return (float, value.hex())
    if kind in _PLAIN:
        return (kind, value)
    if kind is list or kind is tuple:
        return (kind, tuple(encode(v, position) for v in value))
    if kind is dict:
        return (dict, tuple((k, encode(v, position)) for k, v in value.items()))
    raise Unhashable


def _rebind(layout: Layout | None, g: Graph, inputs: Sequence[int]) -> Layout | None:
    """A memoized layout with its input storage ("in", i) as the storage id of this call."""
    if layout is None or layout[4][0] != "in":
        return layout
    return (*layout[:4], ("in", g.tensors[inputs[layout[4][1]]].storage))
