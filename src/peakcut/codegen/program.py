"""A built step: the generated source in a file, loaded, plus the glue to call it on a model."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from peakcut.codegen.arena_plan import ArenaPlan, plan_arena, with_source
from peakcut.codegen.hooks import CodeHook
from peakcut.codegen.host_worker import HostWorker
from peakcut.codegen.source import generate_source, hyper_names, hyper_values
from peakcut.codegen.step_inputs import check_slots, input_mappings
from peakcut.codegen.swap import HostPool, host_copy
from peakcut.codegen.update_inputs import Prepared, StepBindingError, UpdateInputs
from peakcut.codegen.update_progress import PartialUpdateError, update_begun
from peakcut.ir.collectives import overlapped_order
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import TensorMeta
from peakcut.memory import simulate
from peakcut.memory.workspace import model_name, workspace_model
from peakcut.spec.constants import held, resolve
from peakcut.spec.fully_sharded import local_tensor
from peakcut.spec.optimizers import OptimizerSpec
from peakcut.spec.tensor_kinds import batch_problem

__all__ = ["Step", "StepBindingError", "default_program_dir"]


def default_program_dir() -> Path:
    """Where generated programs are written: $PEAKCUT_CACHE/programs or ~/.cache/peakcut/programs."""
    root = os.environ.get("PEAKCUT_CACHE") or Path.home() / ".cache" / "peakcut"
    return Path(root) / "programs"


def _load(path: Path) -> Callable[..., tuple]:
    spec = importlib.util.spec_from_file_location(f"peakcut_program_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load generated program {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.step


class Step:
    """One runnable step. `step(model, batch)` runs it for real (parameters updated in place).

    The update uses a torch.optim optimizer (`optimizer=`, the user's; made from the
    captured description on first use if none is given) and keeps its state there:
    `step.optimizer.state_dict()` is what training did. Hyper-parameters are read from
    its param_groups at every call. A step captured with a GradScaler needs `scaler=`.

    A step with swaps owns a HostPool (`step.host`) that its program allocates host copies
    from, outside the device memory that runtime.measure sees; `step.host_peak_bytes` is the
    peak of host copies alive during the last run (0 without swaps). A step whose plan updates
    parameters on the host owns a HostWorker (`step.host_ops`) that runs those ops.

    `code`: code hooks for nodes beyond the built-in ones (codegen.hooks).

    arena=True: the step places the results it can in one arena (codegen.arena_plan:
    `step.arena_plan` says what is placed and what is not), allocated on the first call and
    kept across calls (`step.arena`, like the HostPool's buffers); an ArenaPlan of the same
    program (the one a search priced): its placement, not one planned again.
    """

    def __init__(self, graph: Graph, order: list[int] | None = None, path: str | Path | None = None,
                 title: str = "", optimizer: torch.optim.Optimizer | None = None, scaler: Any = None,
                 code: Sequence[CodeHook] = (), arena: bool | ArenaPlan = False) -> None:
        self.graph = graph
        self.order = overlapped_order(graph, graph.order if order is None else order)
        model = workspace_model("auto", graph.device)      # the GPU's own for a graph on a GPU
        peak = simulate(graph, self.order, model).peak_bytes
        peak_text = f"{peak:,} bytes (simulated, {model_name(model)} workspace model)"
        self.arena_plan = (with_source(arena, graph, self.order, title, peak_text, code) if isinstance(arena, ArenaPlan)
                           else plan_arena(graph, self.order, title=title, peak=peak_text, extra=code) if arena
                           else None)
        self.arena: torch.Tensor | None = None       # the arena, made on the first call
        self._arena_on = ""                          # the device it was made for
        self.source = (self.arena_plan.source if self.arena_plan is not None
                       else generate_source(graph, self.order, title=title, peak=peak_text, extra=code))
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
        target = Path(path) if path is not None else default_program_dir() / f"step_{digest}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != self.source:
            target.write_text(self.source)
        self.path = target
        self._fn = _load(target)
        self._held = held(graph.input_names)    # the closure tensors its constants bind to, kept alive
        self._slots = check_slots(graph.input_names)   # where each input goes in the step's mappings
        sig = graph.signature
        names = dict(zip(graph.inputs, graph.input_names, strict=True))
        kept = [names[t] for t in graph.host_inputs()]
        host_state = frozenset(n for n in kept if n.startswith("state:"))
        self._host_params = frozenset(n.removeprefix("param:") for n in kept if n.startswith("param:"))
        other = sorted(set(kept) - host_state - {f"param:{n}" for n in self._host_params})
        if other:
            raise StepBindingError(f"input {other[0]!r} is kept in host memory by the plan; a step binds "
                                   "only parameters and optimizer state there so far")
        self._host_positions = frozenset(graph.inputs.index(t) for t in graph.host_inputs())
        self._kept_params: dict[str, torch.Tensor] = {}    # name -> the host buffer its .data is
        self.update = UpdateInputs(OptimizerSpec.from_dict(sig.optimizer), sig.grad_scaler, host_state)
        self.update.attach(optimizer, scaler)
        self._hypers = bool(hyper_names(graph))
        self._prepared = Prepared()
        self._model: torch.nn.Module | None = None
        self._returned_grads = {n.removeprefix("grad:") for n in graph.output_names if n.startswith("grad:")}
        self.grad_norm: torch.Tensor | None = None     # the last call's norm before clipping (max_grad_norm)
        self._batch_spec: Any = None            # the batch structure last checked against the capture
        spec = self.update.spec
        self._updated = {n for g in spec.groups for n in g.params} if spec is not None else set()
        self.host = HostPool()
        keywords = inspect.signature(self._fn).parameters
        self._takes_host = "host" in keywords      # rule code with host copies
        # updates on the host: on a worker thread beside a CUDA device, inline on a CPU
        self.host_ops: HostWorker | None = None
        if "host_ops" in keywords:
            self.host_ops = HostWorker(threaded=torch.device(graph.device).type == "cuda", buffers=self.host)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The torch.optim optimizer whose state and hyper-parameters the step uses."""
        return self.update.optimizer

    @property
    def host_peak_bytes(self) -> int:
        """Peak bytes of host copies (swap-outs) alive during the last run; measured by the
        HostPool, apart from device memory."""
        return self.host.peak_bytes

    # ------------------------------------------------------------ binding
    def _check(self, name: str, t: torch.Tensor | None, meta: TensorMeta) -> torch.Tensor:
        """`t` if it matches the captured input's shape and dtype, else StepBindingError."""
        if t is None:
            raise StepBindingError(f"{name}: no tensor (p.grad is None?)")
        if tuple(t.shape) != meta.shape or str(t.dtype).removeprefix("torch.") != meta.dtype:
            raise StepBindingError(
                f"{name}: got shape {tuple(t.shape)} {t.dtype}, the captured step expects {meta.shape} {meta.dtype}"
            )
        return t

    def ensure_state(self, model: torch.nn.Module, params: Mapping[str, torch.Tensor] | None = None) -> Prepared:
        """Create the optimizer state the program reads (as torch.optim does on a first step)
        and read this step's hyper-parameters; returns what was created and read."""
        self._model = model
        self._prepared = self.update.prepare(model, self.graph.signature.accumulate, self._returned_grads, params)
        return self._prepared

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """'state:<param>.<slot>' -> the optimizer's state tensors for the step's parameters."""
        model = self._model
        return {} if model is None else self.update.state_tensors(model)

    def bind(self, model: torch.nn.Module, batch: Any) -> list[torch.Tensor]:
        """The program's positional inputs for this model and batch, checked against the capture.

        Everything that can be checked is checked before optimizer state is created; state
        created here is removed again if a later check fails (discard_new_state)."""
        problem = batch_problem(batch)
        if problem is not None:
            raise StepBindingError(f"{problem}, which a captured step cannot take")
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        leaves, spec = pytree.tree_flatten(batch)
        self._check_model_and_batch(params, buffers, leaves, spec)
        constants = self._constants(model)
        self.update.device = _device_of(
            {n: p for n, p in params.items() if n not in self._host_params}, leaves)
        self.ensure_state(model, params)
        try:
            return self._inputs(model, params, buffers, leaves, constants)
        except Exception:
            self.discard_new_state()
            raise

    def _constants(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """'const:<key>' -> the tensor each constant input binds to (spec.constants)."""
        found: dict[str, torch.Tensor] = {}
        for tid, name in zip(self.graph.inputs, self.graph.input_names, strict=True):
            kind, _, key = name.partition(":")
            if kind == "const":
                try:
                    found[name] = self._check(name, resolve(key, model), self.graph.tensors[tid])
                except LookupError as e:
                    raise StepBindingError(str(e.args[0])) from None
        return found

    def discard_new_state(self) -> None:
        """Remove the optimizer state the last bind created (its call did not complete)."""
        self.update.discard(self._prepared)

    def _check_model_and_batch(self, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
                               leaves: list[Any], spec: Any) -> None:
        sig = self.graph.signature
        for name in self.graph.input_names:
            kind, _, key = name.partition(":")
            source = {"param": params, "buffer": buffers}.get(kind)
            if source is not None and key not in source:
                raise StepBindingError(f"model has no {kind} named {key!r} (captured with one)")
        if sig.requires_grad:
            now = {n for n, p in params.items() if p.requires_grad}
            changed = sorted(now.symmetric_difference(sig.requires_grad))
            if changed:
                state = "now requires" if changed[0] in now else "no longer requires"
                raise StepBindingError(f"parameter {changed[0]!r} {state} a gradient ({len(changed)} changed since "
                                       "planning): which parameters train is part of the plan; plan again")
        if spec != self._batch_spec and pytree.treespec_dumps(spec) != sig.batch_spec:
            raise StepBindingError("batch: its structure differs from the batch the step was captured with")
        self._batch_spec = spec                 # the last structure that matched: no dump next time
        for tid, name in zip(self.graph.inputs, self.graph.input_names, strict=True):
            if name.startswith("batch:"):
                index = int(name.partition(":")[2])
                if index >= len(leaves):
                    raise StepBindingError(f"batch has {len(leaves)} tensors, the step was captured with more")
                self._check(name, leaves[index], self.graph.tensors[tid])

    def _inputs(self, model: torch.nn.Module, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
                leaves: list[Any], constants: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        opt_state = self.update.state_tensors(model, params)
        values: list[torch.Tensor] = []
        for tid, name in zip(self.graph.inputs, self.graph.input_names, strict=True):
            kind, _, key = name.partition(":")
            source = {"param": params, "buffer": buffers}.get(kind)
            value: torch.Tensor | None
            if kind == "param" and key in self._host_params:
                value = self._kept_on_host(key, local_tensor(params[key]))   # (an FSDP2 shard's own tensor)
            elif source is not None:
                value = source[key]             # present: _check_model_and_batch checked
            elif kind == "state":
                value = opt_state.get(name)
            elif kind == "acc":
                value = params[key].grad if key in params else None
            elif kind == "scaler":
                value = self.update.scaler_for(_device_of(params, leaves))._scale
            elif kind == "const":
                value = constants[name]
            else:
                value = leaves[int(key)]
            # an FSDP2 parameter or its optimizer state is a DTensor: the step takes its local shard
            values.append(self._check(name, None if value is None else local_tensor(value),
                                      self.graph.tensors[tid]))
        return values

    def _kept_on_host(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """Parameter `p`, its data in a host buffer apart from device memory (pinned when it
        came from CUDA; numpy-backed on CPU, outside the allocator measurements see:
        codegen.swap). It is moved there once, by replacing p.data: the model, the optimizer
        (whose state is keyed by the Parameter) and checkpoints keep the same Parameter."""
        kept = self._kept_params.get(name)
        if kept is not None and p.data.data_ptr() == kept.data_ptr():
            return p
        buffer = host_copy(p.detach(), pinned=p.is_cuda)
        p.data = buffer
        self._kept_params[name] = buffer
        return p

    def device_of(self, inputs: list[torch.Tensor]) -> str:
        """The device the program runs on: that of its first input not kept in host memory."""
        for i, t in enumerate(inputs):
            if i not in self._host_positions:
                return str(t.device)
        return self.graph.device

    def capture_scalars(self) -> dict[str, float]:
        """The run-time scalars' values at capture (for runs without an optimizer: fake tracking)."""
        return hyper_values(self.graph)

    def run(self, inputs: list[torch.Tensor], device: str, hp: dict[str, float] | None = None) -> tuple:
        """Call the generated function on already-bound inputs (in program order: its mappings
        are made from them), with `hp` (default: the scalars the last bind() read from the
        optimizer)."""
        kwargs: dict[str, Any] = {"device": device}
        if self._hypers:
            kwargs["hp"] = self._prepared.hp if hp is None else hp
        if self._takes_host:
            self.host.reset_peak()
            kwargs["host"] = self.host
        if self.host_ops is not None:
            kwargs["host_ops"] = self.host_ops
        if self.arena_plan is not None:
            kwargs["arena"] = self._arena(device)
        with torch.no_grad():
            try:
                return self._fn(*input_mappings(self._slots, inputs), **kwargs)
            except BaseException as e:
                if self.host_ops is not None:
                    self.host_ops.discard()     # no host op of a failed step runs later
                if isinstance(e, Exception) and update_begun(self._fn.__code__, e.__traceback__):
                    raise PartialUpdateError(
                        f"the step failed ({type(e).__name__}: {e}) after it had begun writing parameters or "
                        "optimizer state (its schedule runs part of the update before the backward ends): "
                        "they are partly updated; restore the model and the optimizer (e.g. from a "
                        "checkpoint) before the next step") from e
                raise

    def _arena(self, device: str) -> torch.Tensor:
        """The arena on `device`: made once (uint8, the layout's bytes), kept across calls."""
        plan = self.arena_plan
        size = plan.arena_bytes if plan is not None else 0
        if self.arena is None or self._arena_on != device:
            self.arena = torch.empty(size, dtype=torch.uint8, device=device)
            self._arena_on = device
        return self.arena

    # ------------------------------------------------------------ calling
    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        """Run one step: returns the loss (training) or the model output (inference).

        Gradients that the step returns (no optimizer, parameters outside the optimizer, or
        captured with keep_grads) are added to each parameter's .grad, like loss.backward().
        """
        inputs = self.bind(model, batch)
        try:
            outputs = self.run(inputs, self.device_of(inputs))
        except Exception:
            self.discard_new_state()      # e.g. a bad label in the loss: no update ran
            raise
        del inputs
        sig = self.graph.signature
        if sig.mode == "inference":
            spec = pytree.treespec_loads(sig.output_spec)
            return pytree.tree_unflatten(list(outputs), spec)
        named = dict(zip(self.graph.output_names, outputs, strict=True))
        self.grad_norm = named.get("grad_norm")
        self.update.finish(self._prepared, named.get("found_inf"))
        if not self._returned_grads and not sig.accumulate:
            return outputs[0]
        params = dict(model.named_parameters())
        for name, value in named.items():
            if name.startswith("grad:"):
                key = name.removeprefix("grad:")
                p = params[key]
                if value.device != p.device:        # a parameter kept in host memory: its .grad too
                    value = value.to(p.device)
                if p.grad is None or key in self._updated:
                    p.grad = value
                else:
                    p.grad.add_(value)
        if sig.accumulate:
            for name in self._updated:
                params[name].grad = None        # optimizer.zero_grad() after the update
        return outputs[0]


def _device_of(params: Mapping[str, torch.Tensor], leaves: list[Any]) -> torch.device:
    for t in (*params.values(), *leaves):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")
