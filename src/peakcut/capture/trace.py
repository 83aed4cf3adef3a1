"""Trace one step with make_fx over FakeTensors, recording which module made each node."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from peakcut.capture.errors import CaptureError
from peakcut.capture.real_layouts import real_layout_table
from peakcut.capture.rng import traced_rng_state
from peakcut.ir.foreach import ForeachTag
from peakcut.ir.node import Phase


@dataclass
class TraceLog:
    """Where each FX node came from: module path and phase, by creation index."""

    marks: list[tuple[int, str, Phase]] = field(default_factory=list)  # (node count, module, phase)
    stack: list[str] = field(default_factory=list)
    phase: Phase = Phase.FORWARD
    notes: list[str] = field(default_factory=list)  # what capture changed or found, for the user
    kv_caches: list[tuple[str, str]] = field(default_factory=list)  # (module, cache type) that returned one
    # (first node, end) of the nodes one tensor's share of a list op made, and its tag (capture.list_update)
    runs: list[tuple[int, int, ForeachTag]] = field(default_factory=list)
    _reach: list[int] = field(default_factory=list, repr=False)  # running max of the marks' counts
    _next_run: int = field(default=0, repr=False)

    def count(self) -> int:
        """How many FX nodes the trace has made so far."""
        mode = get_proxy_mode()
        return len(mode.tracer.graph.nodes) if mode is not None else 0

    def mark(self) -> None:
        top = self.stack[-1] if self.stack else ""
        self.marks.append((self.count(), top, self.phase))

    def new_run(self) -> int:
        """A new list-op run number."""
        self._next_run += 1
        return self._next_run - 1

    def run_at(self, index: int) -> ForeachTag | None:
        """The foreach tag of the FX node at position `index` (None: not part of a list op)."""
        i = bisect.bisect_right(self.runs, index, key=lambda r: r[0])
        if i == 0:
            return None
        start, end, tag = self.runs[i - 1]
        return tag if start <= index < end else None

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.mark()

    def attribution(self, index: int) -> tuple[str, Phase]:
        """Module and phase of the node created at position `index` of the FX graph: those of the
        last mark before the first one whose count exceeds `index` (a binary search; a scan per
        node was quadratic, 1.2 s of GPT-2-XL's 12k-node capture)."""
        if len(self._reach) != len(self.marks):
            self._reach = list(itertools.accumulate((c for c, _, _ in self.marks), max))
        i = bisect.bisect_right(self._reach, index)
        if i == 0:
            return "", Phase.FORWARD
        _, module, phase = self.marks[i - 1]
        return module, phase


def _install_module_hooks(model: torch.nn.Module, log: TraceLog, stack: ExitStack) -> None:
    for name, mod in model.named_modules():
        path = name or type(model).__name__

        def pre(_m: torch.nn.Module, _args: Any, path: str = path) -> None:
            log.stack.append(path)
            log.mark()

        def post(_m: torch.nn.Module, _args: Any, out: Any, root: bool = not name, path: str = path) -> None:
            cache = _find_kv_cache(out)
            if cache is not None and not any(k[0] == path for k in log.kv_caches):
                log.kv_caches.append((path, type(cache).__name__))
            if log.stack:
                log.stack.pop()
            if root and log.phase is Phase.FORWARD:
                log.phase = Phase.LOSS  # what follows the model's forward is the loss
            log.mark()

        stack.callback(mod.register_forward_pre_hook(pre).remove)
        stack.callback(mod.register_forward_hook(post).remove)


def _explain(e: BaseException) -> str:
    if isinstance(e, DynamicOutputShapeException):
        return (f"operation {getattr(e, 'func', '')} has an output whose shape PyTorch's FakeTensor "
                "cannot tell without the tensor values (unique does; so does ctc_loss, which has no shape "
                "rule), so it cannot be captured as a static graph (peakcut specialises nonzero, "
                "masked_select and boolean-mask indexing on the values it sees at capture, not this op)")
    if isinstance(e, DataDependentOutputException):
        return (f"data-dependent operation {getattr(e, 'func', '')} (e.g. .item(), .tolist() or "
                "Python control flow on tensor values) cannot be captured as a static graph")
    if isinstance(e, UnsupportedOperatorException):
        return f"operator {e.func} has no FakeTensor/meta implementation"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if "data-dependent" in text or "data dependent" in text or "GuardOnDataDependent" in type(e).__name__:
        return f"data-dependent control flow cannot be captured as a static graph: {text}"
    return f"{type(e).__name__}: {text}"


def trace_step(
    fn: Callable[..., Any],
    args: Sequence[Any],
    model: torch.nn.Module,
    log: TraceLog,
    device: torch.device,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> torch.fx.GraphModule:
    """make_fx(fn)(*args) over FakeTensors at eager dispatch level; errors name the module.

    A Hugging Face-style `config.use_cache=True` (on the model or a submodule) is turned off
    for the trace and restored after it, with a note in log.notes: with it the forward builds
    a KV cache object (DynamicCache) a training step never reads and a graph cannot return.
    Saving and setting the state of `device`'s random generator is traced (capture.rng).
    `decompositions` adds entries to the decomposition table (capture.specialize).
    """
    with ExitStack() as stack:
        _disable_kv_cache(model, log, stack)
        _install_module_hooks(model, log, stack)
        stack.enter_context(traced_rng_state(device))
        stack.enter_context(fx_traceback.preserve_node_meta())
        try:
            table = {**real_layout_table(), **(decompositions or {})}
            return make_fx(fn, tracing_mode="fake", decomposition_table=table)(*args)
        except CaptureError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the module path and cause
            where = log.stack[-1] if log.stack else f"{type(model).__name__} (outside any submodule)"
            mod = _module_type(model, where)
            raise CaptureError(
                f"cannot capture {type(model).__name__}: in module '{where}'{mod} during {log.phase.value}: "
                f"{_explain(e)}{kv_cache_hint(e, log)}{_cumulative_batch_norm_hint(model, where, e)}"
            ) from e


def _cumulative_batch_norm_hint(model: torch.nn.Module, path: str, e: BaseException) -> str:
    """Why a batch norm with momentum=None reads a tensor's value: its forward turns
    num_batches_tracked into a Python number (the cumulative average's factor)."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return ""
    if (isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.momentum is None
            and isinstance(e, DataDependentOutputException)):
        return ("; a batch norm with momentum=None (a cumulative moving average) reads "
                "num_batches_tracked as a Python number in its forward: give it a momentum (0.1 is "
                "PyTorch's default) to capture it")
    return ""


def _is_kv_cache(obj: Any) -> bool:
    """A transformers Cache (DynamicCache, StaticCache, ...), recognised without importing transformers."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers")
               for c in type(obj).__mro__)


def _find_kv_cache(out: Any, depth: int = 2) -> Any:
    """A KV cache object in a module's output (looked for two levels deep), or None."""
    if _is_kv_cache(out):
        return out
    if depth == 0 or isinstance(out, (torch.Tensor, str, bytes)):
        return None
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict
        values = list(out.values())
    elif isinstance(out, (tuple, list)):
        values = list(out[:16])
    else:
        return None
    return next((c for v in values if (c := _find_kv_cache(v, depth - 1)) is not None), None)


def kv_cache_hint(e: BaseException | str, log: TraceLog) -> str:
    """An explanation to append to a capture error whose real cause is a KV cache object."""
    text = str(e)
    if not (log.kv_caches or "Cache" in type(e).__name__ or "Cache" in text or "register it as a buffer" in text):
        return ""
    if log.kv_caches:
        module, kind = log.kv_caches[0]
        what = f"the KV cache ({kind}) that module '{module}' returns"
    else:
        what = "a KV cache object (e.g. transformers' DynamicCache) built in forward"
    return (f"; the real cause is {what}: a training step needs no KV cache and a captured step cannot "
            "hold one -- call the model with use_cache=False (or set model.config.use_cache = False) and "
            "pass no past_key_values")


def _disable_kv_cache(model: torch.nn.Module, log: TraceLog, stack: ExitStack) -> None:
    """Set use_cache=False on every module config that has it True, until `stack` closes."""
    seen: set[int] = set()
    for name, mod in model.named_modules():
        config = getattr(mod, "config", None)
        if config is None or id(config) in seen or getattr(config, "use_cache", None) is not True:
            continue
        seen.add(id(config))
        try:
            config.use_cache = False
        except Exception:  # noqa: BLE001 - a read-only config: trace as it is
            continue
        stack.callback(setattr, config, "use_cache", True)
        owner = type(mod).__name__ + (f" ('{name}')" if name else "")
        log.notes.append(f"use_cache=True on {owner}'s config: traced with use_cache=False "
                         "(a training step needs no KV cache, and a captured step cannot return one)")


def _module_type(model: torch.nn.Module, path: str) -> str:
    try:
        return f" ({type(model.get_submodule(path)).__name__})"
    except AttributeError:
        return ""


# The op set: no decompositions. make_fx records ops after PyTorch's own
# CompositeImplicitAutograd decompositions, i.e. exactly the ATen kernels eager
# PyTorch runs (fused batch-norm/layer-norm backward, convolution_backward, ...).
# Core-ATen decompositions changed ResNet-50 gradients by ~3e-6 after one step
# and allocate temporaries eager never does, so they are not used. docs/ir.md
# lists the ops that occur in the seven workloads. The only table entries keep the
# traced layouts the real ones (capture.real_layouts): a few kernels' inputs made
# contiguous as their real kernels do, batch norm's result copied into the real format.


def new_fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)
