"""Tensors a step reads that are neither parameters, buffers nor batch: lifted as inputs.

A plain tensor attribute of a module (`self.alphas_cumprod = torch.linspace(...)`, not a
registered buffer), a module-level global tensor, or a tensor in loss_fn's closure (a
diffusion model's noise schedule indexed by the batch's timesteps) is a constant of the
step. While the step is traced (`ClosedOver`, a TorchFunctionMode), every real tensor an op
is given becomes a FakeTensor; after the trace (`ClosedOver.lift`) each one that an op read
becomes a program input named `const:<where>` (made by capture.convert), with the role of a
buffer (caller-held: it counts for the whole step, like a parameter). At every call the step
binds the input to your tensor object (peakcut.spec.constants), so an in-place change you
make between steps is seen, and an in-place change the step makes happens on your tensor, as
in eager:

- `const:attr:<path>`: an attribute of the model (`scheduler.alphas_cumprod`), looked up on
  the model the step is called with;
- `const:global:<python module>:<name>`: a global of the module that defines loss_fn or a
  module's forward (or one attribute of an object held there), looked up in that module;
- `const:held:<label>`: anything else (a variable in loss_fn's closure, or a tensor found
  nowhere else), held in this process's table of lifted tensors (weakly: the table never
  keeps your tensor alive). Such a step runs in the process that captured it.

Reads of the model's own buffers and frozen parameters from outside the model (a closure
that holds `model.norm.weight`) are bound to those inputs. Refused with a CaptureError
naming the tensor's shape, dtype, where it was found and the module or function that read
it: a tensor that requires grad (lifting it would drop its gradient), the model's own
trainable parameter read from outside the model, a meta tensor (it has no values), one on
another device than the step, one of a kind a step cannot hold (peakcut.spec.tensor_kinds),
and a module attribute or global the step assigns another tensor to after reading it (a
captured step cannot rebind your attribute).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from peakcut.capture.errors import CaptureError
from peakcut.capture.trace import TraceLog
from peakcut.spec.constants import PREFIX, hold, resolve
from peakcut.spec.tensor_kinds import unsupported_kind

LIFTED = "peakcut_input"      # FX node meta: the input name a get_attr node reads (ClosedOver.lift)
_NOWHERE = "found neither on the model, in loss_fn's closure nor in a global"
# Tensor properties whose value is a tensor of the same values (a view): reading one reads them.
_VALUE_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
# Calls on a tensor that read no values: a real tensor stays itself there (its hash stays its own).
_METADATA = frozenset({
    "__hash__", "__repr__", "__format__", "__deepcopy__", "__reduce_ex__", "dim", "ndimension", "size", "stride",
    "numel", "nelement", "element_size", "storage_offset", "data_ptr", "untyped_storage", "is_contiguous",
    "get_device", "register_hook", "register_post_accumulate_grad_hook",
})

@dataclass(frozen=True)
class Place:
    """Where a tensor was found: its binding key and a description for the user."""

    key: str        # 'attr:<path>', 'global:<module>:<path>' or 'held:<label>'
    text: str


@dataclass
class Constant:
    """A tensor the trace read that is not one of the step's inputs."""

    tensor: torch.Tensor    # the user's tensor
    fake: torch.Tensor      # what the trace read instead
    reader: str             # the module or function that read it first
    place: Place            # where it was when first read


class ClosedOver(TorchFunctionMode):
    """While a step is traced: the real tensors ops are given become FakeTensors (the model's
    own buffers and frozen parameters become their traced inputs), recorded for `lift`."""

    def __init__(self, fake_mode: FakeTensorMode, log: TraceLog, model: torch.nn.Module,
                 loss_fn: Callable[..., Any] | None, device: torch.device,
                 params: list[tuple[str, torch.Tensor]], buffers: list[tuple[str, torch.Tensor]]) -> None:
        super().__init__()
        self._fake_mode = fake_mode
        self._log = log
        self._model = model
        self._loss_fn = loss_fn
        self._device = device
        self._params = params
        self._buffers = buffers
        self._swapped: dict[int, torch.Tensor] = {}     # id(real tensor) -> what the trace reads
        self._trained = {id(p): n for n, p in params if p.requires_grad}
        self._owners = {key: (kind, n) for kind, items in (("parameter", params), ("buffer", buffers))
                        for n, t in items if (key := _storage_of(t)) is not None}
        self._found: list[Constant] = []

    def around(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`step(params, buffers, *rest)` traced with this mode on."""
        def traced(params: list[torch.Tensor], buffers: list[torch.Tensor], *rest: Any) -> Any:
            for (_, real), fake in zip(self._params, params, strict=True):
                if not real.requires_grad:
                    self._swapped[id(real)] = fake
            for (_, real), fake in zip(self._buffers, buffers, strict=True):
                self._swapped[id(real)] = fake
            with self:
                return step(params, buffers, *rest)
        return traced

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (_has_real(args) or _has_real(kwargs.values())) and _reads_values(func):
            args, kwargs = pytree.tree_map_only(torch.Tensor, self._swap, (args, kwargs))
        return func(*args, **kwargs)

    def _swap(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, FakeTensor):
            return t
        hit = self._swapped.get(id(t))      # the model's own buffer or frozen parameter
        why = self._why_not(t) if hit is None else None
        if why is not None:
            self._refuse(t, why)
        if hit is None:
            hit = self._swapped[id(t)] = self._fake_mode.from_tensor(t)
            reader = self._reader()
            place = locate(t, self._model, self._loss_fn) or Place(f"held:{_ident(reader)}", _NOWHERE)
            self._found.append(Constant(t, hit, reader, place))
        return hit

    def _why_not(self, t: torch.Tensor) -> str | None:
        """Why the real tensor `t` cannot be read by the step (module doc), or None."""
        name = self._trained.get(id(t))
        if name is not None:
            return (f"it is the model's parameter {name!r}, read from outside the model: read it through the model "
                    "loss_fn is given, so that its gradient is traced")
        kind = unsupported_kind(t)
        if kind is not None:
            return f"it is {kind}"
        storage = _storage_of(t)
        owner = self._owners.get(storage) if storage is not None else None
        if owner is not None:
            return (f"it shares memory with the model's {owner[0]} {owner[1]!r} (a view or .detach() of it): a "
                    "constant of the step would not follow that tensor's updates in the step's order; read it "
                    "through the model loss_fn is given")
        if t.requires_grad and torch.is_grad_enabled():
            return ("it requires grad and is not a parameter of the model: lifted as a constant it would get no "
                    "gradient; register it as an nn.Parameter of the model, or detach it")
        if t.device.type == "meta":
            return "it is a meta tensor, which has no values: make it on the step's device"
        dev = self._device
        same = t.device.type == dev.type and (t.device.index is None or dev.index is None
                                              or t.device.index == dev.index)
        if not same and not (t.dim() == 0 and t.device.type == "cpu"):
            return f"it is on {t.device}, the step runs on {dev}: move it there"
        return None

    def _reader(self) -> str:
        log, root = self._log, type(self._model).__name__
        if not log.stack or log.stack[-1] == root:
            return f"{root}.forward" if log.stack or self._loss_fn is None else "loss_fn"
        path = log.stack[-1]
        try:
            return f"module '{path}' ({type(self._model.get_submodule(path)).__name__})"
        except AttributeError:
            return f"module '{path}'"

    def _refuse(self, t: torch.Tensor, why: str, const: Constant | None = None) -> None:
        """CaptureError naming the tensor, where it was found and who read it (those of
        `const` when given: where it was at its first reading)."""
        place = const.place if const is not None else locate(t, self._model, self._loss_fn)
        reader = const.reader if const is not None else self._reader()
        what = f"a tensor of shape {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        where = place.text if place is not None else _NOWHERE
        raise CaptureError(f"{reader} reads {what} ({where}) that is not an input of the step: {why}")

    def lift(self, gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
        """Mark the graph's reads of the found tensors (get_attr nodes; meta[LIFTED]: the input
        name) for capture.convert, which makes each an input after the placeholders' ones;
        returns (input name, note for the user) per input, in the order of first reading. The
        graph's nodes stay where they are: capture attributes nodes by their position."""
        by_fake = {id(c.fake): c for c in self._found}
        names: dict[int, str] = {}
        out: list[tuple[str, str]] = []
        for node in gm.graph.nodes:
            const = by_fake.get(id(_attr(gm, node))) if node.op == "get_attr" else None
            if const is None:
                continue
            if id(const.fake) not in names:
                name, note = self._named(const, {n for n, _ in out})
                names[id(const.fake)] = name
                out.append((name, note))
            node.meta[LIFTED] = names[id(const.fake)]
        return out

    def _named(self, const: Constant, taken: set[str]) -> tuple[str, str]:
        t, place = const.tensor, const.place
        key = place.key
        if not key.startswith("held:") and _resolved(key, self._model) is not t:
            self._refuse(t, f"the step assigns another tensor to {place.text.partition(',')[0]} after reading it, and "
                         "a captured step cannot rebind it: register it as a buffer and update it in place "
                         "(copy_), or keep the new tensor elsewhere", const)
        if key.startswith("held:"):
            key = "held:" + hold(key.removeprefix("held:"), t, taken)
        name = PREFIX + key
        note = (f"constant {name}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}, {place.text}, read in "
                f"{const.reader}: an input of the step, bound to that tensor at every step (in-place changes are "
                "seen) and counted with the buffers")
        return name, note


def _storage_of(t: torch.Tensor) -> tuple[str, int] | None:
    """(device, address) of the memory `t` is a view of; None where it has none (meta)."""
    if t.device.type == "meta" or isinstance(t, FakeTensor):
        return None
    try:
        address = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):     # sparse, nested: no storage of their own
        return None
    return (str(t.device), address) if address else None


def _resolved(key: str, model: torch.nn.Module) -> torch.Tensor | None:
    try:
        return resolve(key, model)
    except LookupError:
        return None


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """The value a get_attr node reads."""
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _has_real(values: Iterable[Any]) -> bool:
    """Whether `values` (lists and tuples looked into) hold a tensor that is not a FakeTensor."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if not isinstance(v, FakeTensor):
                return True
        elif isinstance(v, (list, tuple)) and _has_real(v):
            return True
    return False


def _reads_values(func: Any) -> bool:
    """Whether a call handed to __torch_function__ may read its tensors' values: not a
    property (but the value properties), not a metadata query."""
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):
        return name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") in _VALUE_PROPERTIES
    return name not in _METADATA


def _ident(text: str) -> str:
    return "read_in_" + "".join(c if c.isalnum() else "_" for c in text).strip("_")


# ---------------------------------------------------------------------------- locating
def locate(t: torch.Tensor, model: torch.nn.Module, loss_fn: Callable[..., Any] | None) -> Place | None:
    """Where `t` is found by identity: an attribute of the model, loss_fn's closure, a global
    of loss_fn's or a module's forward's module (or one attribute of an object found there)."""
    return next((place for place, value in _places(model, loss_fn) if value is t), None)


def _places(model: torch.nn.Module, loss_fn: Callable[..., Any] | None) -> Iterator[tuple[Place, Any]]:
    """Every (place, value) `locate` looks at, in the order it prefers them."""
    for path, mod in model.named_modules():
        for name, value in vars(mod).items():
            if isinstance(value, torch.Tensor):
                dotted = f"{path}.{name}" if path else name
                yield Place(f"attr:{dotted}", f"model attribute '{dotted}', not a registered buffer"), value
    if loss_fn is not None:
        yield from _closure_places(loss_fn)
    functions = [*_functions(loss_fn), *(getattr(type(m), "forward", None) for m in model.modules())]
    seen: set[int] = set()
    for fn in functions:
        space = getattr(fn, "__globals__", None)
        if not isinstance(space, dict) or id(space) in seen:
            continue
        seen.add(id(space))
        module = str(space.get("__name__", "?"))
        for name, value in list(space.items()):
            yield Place(f"global:{module}:{name}", f"global '{name}' of module {module}"), value
            for member, inner in _members(value):
                yield Place(f"global:{module}:{name}.{member}", f"global '{name}.{member}' of module {module}"), inner


def _functions(fn: Any) -> Iterator[Any]:
    """The plain functions behind a callable (a partial's, a bound method's)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.ismethod(fn):
        fn = fn.__func__
    if isinstance(fn, types.FunctionType):
        yield fn
    elif fn is not None and callable(fn):
        yield type(fn).__call__


def _closure_places(loss_fn: Callable[..., Any]) -> Iterator[tuple[Place, Any]]:
    fn: Any = loss_fn
    while isinstance(fn, functools.partial):
        for i, value in enumerate(fn.args):
            yield from _held(f"loss_fn.arg{i}", f"argument {i} bound by functools.partial to loss_fn", value)
        for name, value in fn.keywords.items():
            yield from _held(f"loss_fn.{name}", f"argument {name!r} bound by functools.partial to loss_fn", value)
        fn = fn.func
    if inspect.ismethod(fn):
        yield from _held("loss_fn.self", "the object whose method loss_fn is", fn.__self__)
        fn = fn.__func__
    elif not isinstance(fn, types.FunctionType):
        yield from _held("loss_fn", "the callable object loss_fn", fn)
        return
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
        try:
            value = cell.cell_contents
        except ValueError:      # an empty cell
            continue
        yield from _held(f"loss_fn.{name}", f"variable '{name}' in loss_fn's closure", value)


def _held(label: str, text: str, value: Any) -> Iterator[tuple[Place, Any]]:
    yield Place(f"held:{label}", text), value
    for member, inner in _members(value):
        yield Place(f"held:{label}.{member}", f"'{member}' of {text}"), inner


def _members(value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors one attribute into an object (a module: its parameters, buffers and tensor
    attributes); none for tensors, modules, classes and functions."""
    if isinstance(value, torch.nn.Module):
        yield from value.named_parameters()
        yield from value.named_buffers()
        for path, mod in value.named_modules():
            for name, inner in vars(mod).items():
                if isinstance(inner, torch.Tensor):
                    yield (f"{path}.{name}" if path else name), inner
        return
    if isinstance(value, (torch.Tensor, types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        for name, inner in list(attrs.items()):
            if isinstance(inner, torch.Tensor):
                yield name, inner
