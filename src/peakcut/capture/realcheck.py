"""Captured metadata is the real metadata: output dtypes checked against the real kernels.

Capture traces over FakeTensors, so every output's dtype comes from a fake/meta
kernel. A few of those disagree with the kernel that really runs. Known case:
on CPU, ``native_layer_norm`` (and group/batch norm) of a bf16/fp16 input with
fp32 weight -- what ``torch.autocast("cpu", dtype=torch.bfloat16)`` produces
for a LayerNorm whose input came out of a bf16 matmul -- really returns fp32
``mean``/``rstd``; the fake kernel says bf16. ``native_group_norm_backward`` in
the same situation really returns a bf16 input gradient; the fake kernel says
fp32. A graph that believes the fake kernel sizes those tensors wrongly in the
memory simulation, and a plan that swaps the statistics out (host buffer of the
recorded dtype) feeds bf16 statistics to ``native_layer_norm_backward``, which
then fails with "expected scalar type Float but found BFloat16".

``real_output_dtypes`` walks the traced FX graph in order and, per op call:

1. propagation: when an input's dtype was corrected earlier, the fake kernel is
   re-run (full shapes, FakeTensors: free) on the corrected input dtypes;
2. ``KNOWN``: a small table of known fake/real disagreements, per device type,
   applied without running anything (the fallback when a real run is not
   possible, e.g. ``native_group_norm_backward`` whose size arguments cannot be
   shrunk generically);
3. the real-run check: the real kernel runs once per distinct call signature
   (op, input dtypes and ranks, non-size arguments; cached for the capture) on
   the capture device, at the real shapes when the call is small (<= 1 MiB of
   inputs and outputs), else at shrunk shapes (every dimension > 8 mapped, in
   order, to 9, 10, ...; integer arguments equal to such a size mapped alike;
   the fake kernel must accept the shrunk call and give the same output dtypes
   and ranks as the full one, else the call is not run). Inputs are filled with
   constants (the RNG is never touched), autocast is off. The real dtypes win.

Which calls are checked (narrow, the default): calls whose floating dtypes are
mixed -- among the inputs, or between inputs and outputs, or among the outputs --
and calls of ops in ``KNOWN``. Views, factories, random and opaque (unregistered)
ops are never run: views follow their base (via propagation), factories and
random ops take their dtype from their arguments, opaque ops may not be safe to
run. Why narrow rather than every call: dtype disagreements come from kernels
that choose an accumulation/statistics dtype apart from their input's (the
norms); a call whose inputs and outputs all share one floating dtype is plain
type promotion, which fake and real kernels implement with the same code; and
running every call would mean shrinking every view/reshape/matmul, whose size
arguments tie the shapes together. ``select="all"`` runs every non-view call
instead; on bf16-autocast BERT, GPT-2 and Llama (tiny) and BERT-base, GPT-Neo-1.3B
and ResNet-50 (paper size) it found nothing the narrow check misses
(tests/capture/test_real_metadata.py keeps that true for BERT). The narrow check
costs 0.01-0.2 s a capture (7-15 real runs at paper size).

Code that re-runs graph ops over FakeTensors (Graph.check's shape check, fission's
part layouts, TASO's run_fake) gets the fake kernel's dtypes back and passes them
through ``ir.real_dtypes.with_real_dtypes`` (KNOWN lives there, below the IR); a node
whose dtypes were corrected also carries the tag ``fake_dtypes`` (convert.py).

Output ranks are compared too; a rank disagreement cannot be fixed from a tiny
run (the real shape is unknown), so the fake metadata stays and a note says so.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from peakcut.ir.real_dtypes import KNOWN, known_real_dtypes
from peakcut.ir.registry import OpKind, lookup

# Calls whose inputs and outputs together are at most this many bytes run at their real shapes.
FULL_SIZE_BYTES = 1 << 20
# Sizes up to this stay as they are when shrinking (they are also dims, flags, kernel sizes).
_KEEP = 8
# A shrunk call producing more than this many bytes is not run.
_SHRUNK_LIMIT = 16 << 20

Dtypes = tuple[torch.dtype | None, ...]


# ------------------------------------------------------------------ the walk
@dataclass
class RealCheck:
    """The outcome of real_output_dtypes."""

    dtypes: dict[torch.fx.Node, Dtypes] = field(default_factory=dict)  # corrected nodes only
    notes: list[str] = field(default_factory=list)
    real_runs: int = 0          # real kernel runs (distinct call signatures that could run)
    checked: int = 0            # op calls the real-run check covered (cache hits included)
    unchecked: int = 0          # selected op calls no real kernel could run for (fake/KNOWN kept)


def real_output_dtypes(gm: torch.fx.GraphModule, *, select: str = "narrow",
                       run_real: bool = True) -> RealCheck:
    """Per call_function node whose real output dtypes differ from its FakeTensor val: the
    real dtype of each output (None where the output is not a tensor), in output order.

    select: "narrow" (mixed-dtype calls and KNOWN ops) or "all" (every non-view call);
    run_real=False applies propagation and KNOWN only.
    """
    if select not in ("narrow", "all"):
        raise ValueError(f"select: 'narrow' or 'all', got {select!r}")
    walk = _Walk(select, run_real and _get_current_dispatch_mode() is None)
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            walk.visit(node)
    return walk.finish()


def _vals(node: torch.fx.Node) -> list[Any]:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _dtypes(values: Sequence[Any]) -> Dtypes:
    return tuple(v.dtype if isinstance(v, torch.Tensor) else None for v in values)


def _ranks(values: Sequence[Any]) -> tuple[int | None, ...]:
    return tuple(v.dim() if isinstance(v, torch.Tensor) else None for v in values)


def _fx_inputs(value: Any) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.map_arg(value, out.append)
    return out


def _map(value: Any, fn: Callable[[torch.fx.Node], Any], on_int: Callable[[int], int] | None = None) -> Any:
    if isinstance(value, torch.fx.Node):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map(v, fn, on_int) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    if isinstance(value, dict):
        return {k: _map(v, fn, on_int) for k, v in value.items()}
    if on_int is not None and type(value) is int:
        return on_int(value)
    return value


class _Walk:
    def __init__(self, select: str, run_real: bool) -> None:
        self.select = select
        self.run_real = run_real
        self.result = RealCheck()
        self.cache: dict[Any, tuple[Dtypes, tuple[int | None, ...]] | None] = {}
        self._fake_mode: Any = None
        self.fixed: dict[tuple[str, str], list[str]] = {}

    # -------------------------------------------------------------- current dtypes
    def dtype(self, node: torch.fx.Node) -> torch.dtype | None:
        """The dtype `node` really has (a tensor-valued FX node: an op's single output or a getitem)."""
        if node.op == "call_function" and node.target is operator.getitem:
            parent, i = node.args
            fixed = self.result.dtypes.get(parent) if isinstance(parent, torch.fx.Node) else None
            if fixed is not None and isinstance(i, int):
                return fixed[i]
        fixed = self.result.dtypes.get(node)
        if fixed is not None:
            return fixed[0]
        val = node.meta.get("val")
        return val.dtype if isinstance(val, torch.Tensor) else None

    def changed(self, node: torch.fx.Node) -> bool:
        val = node.meta.get("val")
        return isinstance(val, torch.Tensor) and self.dtype(node) != val.dtype

    # -------------------------------------------------------------- one call
    def visit(self, node: torch.fx.Node) -> None:
        op = node.target
        name = str(op)
        vals = _vals(node)
        fake = _dtypes(vals)
        if not any(d is not None for d in fake):
            return
        info = lookup(name)
        kind = info.kind if info is not None else None
        inputs = _fx_inputs((node.args, node.kwargs))
        base = fake  # the fake kernel's dtypes on the inputs' real dtypes
        if any(self.changed(i) for i in inputs):
            refaked = self._refake(node)
            if refaked is None:
                self.result.notes.append(
                    f"{node.name} ({name}) reads a tensor whose real dtype differs from the fake one, and "
                    "its fake kernel rejects the real dtypes: kept the fake output dtypes")
            else:
                base = refaked
        device_type = next((v.device.type for v in vals if isinstance(v, torch.Tensor)), "cpu")
        arg_dtypes = [self.dtype(a) if isinstance(a, torch.fx.Node) else None for a in node.args]
        known = known_real_dtypes(name, arg_dtypes, base, device_type)
        now = base if known is None else known
        if self.run_real and self._selected(kind, inputs, now, name, device_type):
            real = self._real(node, base)
            if real is not None:
                real_dtypes, real_ranks = real
                for i, (r, f) in enumerate(zip(real_ranks, _ranks(vals), strict=True)):
                    if r != f and r is not None and f is not None:
                        self.result.notes.append(
                            f"{node.name} ({name}): output {i} really has rank {r}, the fake kernel "
                            f"says {f}; kept the fake shape")
                now = tuple(r if f is not None else None for r, f in zip(real_dtypes, fake, strict=True))
        if now != fake:
            self.result.dtypes[node] = now
            diff = ", ".join(f"output {i} is {_short(d)} (fake kernel: {_short(f)})"
                             for i, (d, f) in enumerate(zip(now, fake, strict=True)) if d != f)
            self.fixed.setdefault((name, diff), []).append(node.name)

    def finish(self) -> RealCheck:
        for (name, diff), nodes in self.fixed.items():
            where = ", ".join(nodes[:3]) + (f", ... ({len(nodes)} calls)" if len(nodes) > 3 else "")
            self.result.notes.append(f"{name}: really runs with {diff}; recorded the real dtypes at {where}")
        return self.result

    def _selected(self, kind: OpKind | None, inputs: Sequence[torch.fx.Node],
                  outs: Dtypes, name: str, device_type: str) -> bool:
        if kind is None or kind in (OpKind.VIEW, OpKind.FACTORY, OpKind.RANDOM, OpKind.SWAP):
            return False
        if not inputs:
            return False
        if name in KNOWN.get(device_type, {}) or self.select == "all":
            return True
        floats = {d for d in (*(self.dtype(i) for i in inputs), *outs) if d is not None and d.is_floating_point}
        return len(floats) > 1

    # -------------------------------------------------------------- fake re-run
    def _fake(self) -> Any:
        if self._fake_mode is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self._fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        return self._fake_mode

    def _refake(self, node: torch.fx.Node) -> Dtypes | None:
        """The fake kernel's output dtypes on the inputs' real dtypes (full shapes)."""
        def make(n: torch.fx.Node) -> Any:
            v = n.meta.get("val")
            if not isinstance(v, torch.Tensor):
                return v
            return torch.empty_strided(v.shape, v.stride(), dtype=self.dtype(n), device=v.device)

        op = node.target
        if not callable(op):
            return None
        try:
            with self._fake():
                args = _map(node.args, make)
                kwargs = _map(node.kwargs, make)
                out = op(*args, **kwargs)
        except Exception:  # noqa: BLE001 - any failure: the caller keeps the traced dtypes
            return None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(_vals(node)):
            return None
        return _dtypes(outs)

    # -------------------------------------------------------------- real run
    def _real(self, node: torch.fx.Node, expect: Dtypes) -> tuple[Dtypes, tuple[int | None, ...]] | None:
        """The real kernel's output dtypes and ranks for this call, or None if it cannot run.

        expect: the fake kernel's dtypes for the full-size call (the shrunk call must agree).
        """
        key = self._key(node)
        if key is not None and key in self.cache:
            result = self.cache[key]
        else:
            result = self._run(node, expect)
            self.result.real_runs += result is not None
            if key is not None:
                self.cache[key] = result
        if result is None:
            self.result.unchecked += 1
        else:
            self.result.checked += 1
        return result

    def _key(self, node: torch.fx.Node) -> Any:
        def enc(n: torch.fx.Node) -> Any:
            v = n.meta.get("val")
            return ("T", self.dtype(n), v.dim(), str(v.device)) if isinstance(v, torch.Tensor) else ("V", repr(v))

        def int_class(i: int) -> Any:
            return i if abs(i) <= _KEEP else "size"

        try:
            key = (node.target, _map(node.args, enc, int_class), _map(node.kwargs, enc, int_class))
            return _freeze(key)
        except TypeError:
            return None

    def _run(self, node: torch.fx.Node, expect: Dtypes) -> tuple[Dtypes, tuple[int | None, ...]] | None:
        op = node.target
        if not callable(op):
            return None
        inputs = _fx_inputs((node.args, node.kwargs))
        in_vals = [v for v in (n.meta.get("val") for n in inputs) if isinstance(v, torch.Tensor)]
        if len(in_vals) != len(inputs):
            return None
        total = sum(v.numel() * _itemsize(self.dtype(n)) for n, v in zip(inputs, in_vals, strict=True))
        total += sum(v.numel() * v.element_size() for v in _vals(node) if isinstance(v, torch.Tensor))
        if total <= FULL_SIZE_BYTES:
            size: Callable[[int], int] | None = None
        else:
            big = sorted({int(s) for v in in_vals for s in v.shape if int(s) > _KEEP})
            table = {s: _KEEP + 1 + k for k, s in enumerate(big)}

            def size(i: int) -> int:
                return table.get(i, i)

        def make(n: torch.fx.Node, fake: bool) -> torch.Tensor:
            v = n.meta["val"]
            shape = [int(s) if size is None else size(int(s)) for s in v.shape]
            dtype = self.dtype(n)
            if fake:
                return torch.empty(shape, dtype=dtype, device=v.device)
            return _filled(shape, dtype, v.device)

        on_int = None if size is None else size
        if size is not None:  # the shrunk call must mean the same to the fake kernel
            try:
                with self._fake(), _quiet_fake_tensor_log():
                    out = op(*_map(node.args, lambda n: make(n, True), on_int),
                                      **_map(node.kwargs, lambda n: make(n, True), on_int))
            except Exception:  # noqa: BLE001 - the shrunk call is not valid: not run
                return None
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outs) != len(expect) or _dtypes(outs) != expect or _ranks(outs) != _ranks(_vals(node)):
                return None
            if sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor)) > _SHRUNK_LIMIT:
                return None
        try:
            device_type = in_vals[0].device.type
            with torch.no_grad(), _no_autocast(device_type):
                out = op(*_map(node.args, lambda n: make(n, False), on_int),
                                  **_map(node.kwargs, lambda n: make(n, False), on_int))
        except Exception:  # noqa: BLE001 - the real kernel rejects the call: not checked
            return None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(expect):
            return None
        return _dtypes(outs), _ranks(outs)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    hash(value)
    return value


def _itemsize(dtype: torch.dtype | None) -> int:
    return dtype.itemsize if dtype is not None else 0


def _filled(shape: Sequence[int], dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """A real tensor of constants (never drawn from the RNG): 0.5 for floats, 0 / False else."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.fill_(0.5) if (t.dtype.is_floating_point or t.dtype.is_complex) else t.zero_()


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs every meta-kernel failure at error level; a rejected shrunk call is expected."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was


class _no_autocast:  # noqa: N801 - a context manager
    def __init__(self, device_type: str) -> None:
        try:
            self._ctx: Any = torch.autocast(device_type, enabled=False)
        except RuntimeError:
            self._ctx = None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _short(d: torch.dtype | None) -> str:
    return str(d).removeprefix("torch.")
