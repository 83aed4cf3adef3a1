"""A built step: the generated source in a file, loaded, plus the glue to call it on a model."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from peakcut.capture.optimizers import init_state, spec_from_dict
from peakcut.codegen.source import generate_source
from peakcut.codegen.swap import HostPool, has_swaps
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import TensorMeta


class StepBindingError(ValueError):
    """The model or batch given to a step does not match what was captured."""


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

    Optimizer state lives here (created as zeros on the first call, like a fresh
    torch.optim optimizer) and is exposed as `step.state` (name -> tensor).

    A step with swaps owns a HostPool (`step.host`) that its program allocates host copies
    from, outside the device memory that runtime.measure sees; `step.host_peak_bytes` is the
    peak of host copies alive during the last run (0 without swaps).
    """

    def __init__(self, graph: Graph, order: list[int] | None = None, path: str | Path | None = None,
                 title: str = "") -> None:
        self.graph = graph
        self.order = list(graph.order if order is None else order)
        peak = graph.simulate(self.order).peak_bytes
        self.source = generate_source(graph, self.order, title=title, peak=f"{peak:,} bytes (simulated, cpu workspace model)")
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
        target = Path(path) if path is not None else default_program_dir() / f"step_{digest}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != self.source:
            target.write_text(self.source)
        self.path = target
        self._fn = _load(target)
        self.state: dict[str, torch.Tensor] = {}
        self.optimizer = spec_from_dict(graph.signature.optimizer)
        self.host = HostPool()
        self._swaps = has_swaps(graph)

    @property
    def host_peak_bytes(self) -> int:
        """Peak bytes of host copies (swap-outs) alive during the last run; measured by the
        HostPool, apart from device memory."""
        return self.host.peak_bytes

    # ------------------------------------------------------------ binding
    def _check(self, name: str, t: torch.Tensor, meta: TensorMeta) -> None:
        if tuple(t.shape) != meta.shape or str(t.dtype).removeprefix("torch.") != meta.dtype:
            raise StepBindingError(
                f"{name}: got shape {tuple(t.shape)} {t.dtype}, the captured step expects {meta.shape} {meta.dtype}"
            )

    def ensure_state(self, model: torch.nn.Module) -> None:
        """Create the optimizer state (zeros, step 0) if this step has not run yet."""
        if self.state or self.optimizer is None:
            return
        params = dict(model.named_parameters())
        names = [n.removeprefix("state:") for n in self.graph.input_names if n.startswith("state:")]
        shared_slots = self.optimizer.shared_slots()
        owners = list(dict.fromkeys(n.rpartition(".")[0] for n in names if n not in shared_slots))
        missing = [p for p in owners if p not in params]
        if missing:
            raise StepBindingError(f"optimizer state for {missing[:3]} does not match the model's parameters")
        per_param, shared = init_state(self.optimizer, [params[p] for p in owners])
        for owner, slots in zip(owners, per_param, strict=True):
            for slot, tensor in zip(self.optimizer.slots(), slots, strict=True):
                self.state[f"state:{owner}.{slot}"] = tensor
        for slot, tensor in zip(shared_slots, shared, strict=True):
            self.state[f"state:{slot}"] = tensor

    def bind(self, model: torch.nn.Module, batch: Any) -> list[torch.Tensor]:
        """The program's positional inputs for this model and batch, checked against the capture."""
        self.ensure_state(model)
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        leaves, spec = pytree.tree_flatten(batch)
        if pytree.treespec_dumps(spec) != self.graph.signature.batch_spec:
            raise StepBindingError("batch: its structure differs from the batch the step was captured with")
        values: list[torch.Tensor] = []
        for tid, name in zip(self.graph.inputs, self.graph.input_names, strict=True):
            kind, _, key = name.partition(":")
            source = {"param": params, "buffer": buffers}.get(kind)
            if source is not None:
                if key not in source:
                    raise StepBindingError(f"model has no {kind} named {key!r} (captured with one)")
                value = source[key]
            elif kind == "state":
                value = self.state[name]
            else:
                value = leaves[int(key)]
            self._check(name, value, self.graph.tensors[tid])
            values.append(value)
        return values

    def device_of(self, inputs: list[torch.Tensor]) -> str:
        return str(inputs[0].device) if inputs else self.graph.device

    def run(self, inputs: list[torch.Tensor], device: str) -> tuple:
        """Call the generated function on already-bound inputs."""
        with torch.no_grad():
            if not self._swaps:
                return self._fn(*inputs, device=device)
            self.host.reset_peak()
            return self._fn(*inputs, device=device, host=self.host)

    # ------------------------------------------------------------ calling
    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        """Run one step: returns the loss (training) or the model output (inference).

        Gradients that the step returns (no optimizer, or captured with keep_grads)
        are stored in each parameter's .grad, replacing what was there.
        """
        inputs = self.bind(model, batch)
        outputs = self.run(inputs, self.device_of(inputs))
        del inputs
        if self.graph.signature.mode == "inference":
            spec = pytree.treespec_loads(self.graph.signature.output_spec)
            return pytree.tree_unflatten(list(outputs), spec)
        params = dict(model.named_parameters())
        for name, value in zip(self.graph.output_names, outputs, strict=True):
            if name.startswith("grad:"):
                params[name.removeprefix("grad:")].grad = value
        return outputs[0]
