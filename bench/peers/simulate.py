"""Paper sizes, simulated: each peer's training step as a peakcut Graph, run through the
same memory simulator (peakcut.memory.simulate, CPU workspace model) and device cost models
(simulate_timeline with the analytic rtx3090 / h100 / h200 profiles) as peakcut's own plans.

- eager: peakcut.capture of the step (make_fx over FakeTensors, AdamW update included).
- checkpoint: the same capture of the model with checkpoint wrappers; make_fx records
  the recomputation where autograd runs it (inside the backward).
- sac: the same with torchtitan's selective policy (bench.peers.sac), traced as it runs eagerly.
- accumulate: the k-micro-batch step (bench.peers.accumulate.accumulation_graph), the same
  parameters updated as eager's capture.
- offload: the ZeRO-Offload-style plan (peakcut.optimizer.baselines): the host_update rule on
  every parameter of the eager capture, its host nodes placed for each profile.
- compile (aot_eager partition): AOTAutograd traces the joint forward+backward graph of
  the loss over FakeTensors once per workload; inside its partition_fn the min-cut
  partitioner (torch._functorch.partitioners.min_cut_rematerialization_partition, what
  the aot_eager and inductor backends use) is run once per budget/solver. Each partitioned
  forward/backward pair is then re-traced as one program (forward, then backward fed the
  forward's saved outputs and a ones tangent, then the same AdamW update:
  peakcut.capture.capture_with_gradients), so saved tensors stay live until the backward's
  last reader.
  The joint graph is the whole loss without graph breaks (no Dynamo).
- compile inductor: not simulated (Inductor's fused kernels have no peakcut IR or cost).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

import peakcut
from bench.peers.accumulate import BATCHNORM_NOTE, accumulation_graph, has_batchnorm, spec_of
from bench.peers.peakcut_hook import peakcut_graph
from bench.peers.results import Cell, fail_reason
from bench.peers.sac import traced_as_eager
from bench.peers.tools import Tool, apply_checkpointing, apply_selective_checkpointing
from peakcut import Graph
from peakcut.capture import BoundModel, GroupSpec, OptimizerSpec, capture_with_gradients
from peakcut.cost import get_cost_model
from peakcut.memory import simulate
from peakcut.optimizer.baselines import offload_plan
from peakcut.simulate import simulate_timeline
from peakcut.workloads import WorkloadInstance

PROFILES: tuple[str, ...] = ("rtx3090", "h100", "h200")
OPTIMIZER_HYPER = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}  # AdamW defaults
INDUCTOR_REASON = "Inductor's fused kernels have no peakcut IR"


def evaluate(cell: Cell, g: Graph, order: list[int] | None = None,
             profiles: tuple[str, ...] = PROFILES) -> Cell:
    """Fill peak (peakcut.memory.simulate) and per-profile latency (simulate_timeline) of a graph."""
    order = list(g.order if order is None else order)
    memory = simulate(g, order)
    cell.peak_bytes = int(memory.peak_bytes)
    cell.baseline_bytes = int(memory.baseline_bytes)
    cell.nodes = len(g.nodes)
    for profile in profiles:
        cell.latency[profile] = float(simulate_timeline(g, order, get_cost_model(profile)).latency_seconds)
    return cell


def evaluate_offload(cell: Cell, g: Graph, profiles: tuple[str, ...] = PROFILES) -> Cell:
    """The ZeRO-Offload-style plan of eager step `g`, placed and evaluated per profile."""
    for profile in profiles:
        program, order, refused = offload_plan(g, get_cost_model(profile))
        evaluate(cell, program, order, (profile,))
        cell.profile_peak[profile] = int(cell.peak_bytes or 0)
        cell.note = f"{len(refused)} updates kept on the device" if refused else "every update on the host"
    cell.peak_bytes = max(cell.profile_peak.values())
    return cell

def _fake(fake_mode: Any, t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    """A FakeTensor on cpu with t's layout (t may live on the meta device)."""
    with fake_mode:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return out.requires_grad_(requires_grad)


@contextlib.contextmanager
def _hf_sees_tracing() -> Iterator[None]:
    """Make transformers treat FunctionalTensors as traced (as it does fake tensors under make_fx).

    AOTAutograd's metadata pass runs the model on FunctionalTensor-wrapped fakes, which
    transformers' is_tracing() misses; it then calls padding_mask.all() (data-dependent).
    With the patch the explicit attention mask is built, as in peakcut.capture's graph.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    from torch._subclasses.functional_tensor import FunctionalTensor

    original = masking_utils.is_tracing

    def is_tracing(tensor: Any = None) -> bool:
        return isinstance(tensor, FunctionalTensor) or original(tensor)

    masking_utils.is_tracing = is_tracing
    try:
        yield
    finally:
        masking_utils.is_tracing = original


def capture_checkpointed(inst: WorkloadInstance) -> tuple[Graph, str]:
    """peakcut.capture of the step with checkpoint wrappers on a copy of the model."""
    model = copy.deepcopy(inst.model)
    note = apply_checkpointing(inst.name, model)
    return peakcut.capture(model, inst.batch, inst.loss_fn, "adamw"), note


def capture_selective(inst: WorkloadInstance) -> tuple[Graph, str]:
    """peakcut.capture of the step with torchtitan's selective checkpointing on a copy of the model."""
    model = copy.deepcopy(inst.model)
    note = apply_selective_checkpointing(inst.name, model)
    with traced_as_eager():
        return peakcut.capture(model, inst.batch, inst.loss_fn, "adamw"), note


def capture_accumulation(inst: WorkloadInstance, k: int, eager: Graph) -> tuple[Graph, str]:
    """The k-micro-batch step, updating the parameters `eager` (the eager capture) updates."""
    g = accumulation_graph(inst.model, inst.batch, inst.loss_fn, k, spec_of(eager))
    note = f"micro-batch {inst.batch_size // k}"
    return g, note + (f"; {BATCHNORM_NOTE}" if has_batchnorm(inst.model) else "")


class JointCapture:
    """The min-cut partitions of one workload's loss, one per compile tool."""

    def __init__(self, inst: WorkloadInstance, tools: list[Tool]) -> None:
        self.inst = inst
        model = inst.model
        self.param_items = list(model.named_parameters(remove_duplicate=True))
        self.buffer_items = list(model.named_buffers(remove_duplicate=True))
        self.batch_leaves, self.batch_spec = pytree.tree_flatten(inst.batch)
        self.partitions: dict[Tool, tuple[torch.fx.GraphModule, torch.fx.GraphModule, int] | BaseException] = {}
        self.seconds = 0.0
        self._trace(tools)

    def _loss(self, params: list[torch.Tensor], buffers: list[torch.Tensor], leaves: list[torch.Tensor]) -> torch.Tensor:
        state = {n: p for (n, _), p in zip(self.param_items, params, strict=True)}
        state.update({n: b for (n, _), b in zip(self.buffer_items, buffers, strict=True)})
        batch = pytree.tree_unflatten(list(leaves), self.batch_spec)
        return self.inst.loss_fn(BoundModel(self.inst.model, state), batch)

    def _trace(self, tools: list[Tool]) -> None:
        from functorch.compile import aot_function, min_cut_rematerialization_partition, nop

        def partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
            for tool in tools:
                with tool.config():
                    try:
                        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kw)
                        self.partitions[tool] = (fw, bw, kw["num_fwd_outputs"])
                    except Exception as e:  # noqa: BLE001 - recorded per tool
                        self.partitions[tool] = e
            return min_cut_rematerialization_partition(joint, joint_inputs, **kw)

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        params = [_fake(fake_mode, p, p.requires_grad) for _, p in self.param_items]
        buffers = [_fake(fake_mode, b) for _, b in self.buffer_items]
        leaves = [_fake(fake_mode, t) for t in self.batch_leaves]
        t0 = time.perf_counter()
        compiled = aot_function(self._loss, fw_compiler=nop, bw_compiler=nop, partition_fn=partition)
        with fake_mode, _hf_sees_tracing():
            compiled(params, buffers, leaves)
        self.seconds = time.perf_counter() - t0

    def graph(self, tool: Tool) -> Graph:
        """The partitioned forward+backward of `tool`, re-traced with the AdamW update."""
        part = self.partitions[tool]
        if isinstance(part, BaseException):
            raise part
        fw, bw, num_fwd_outputs = part
        return _joint_graph(self, fw, bw, num_fwd_outputs)


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _joint_graph(jc: JointCapture, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule,
                 num_fwd_outputs: int) -> Graph:
    n_params, n_buffers = len(jc.param_items), len(jc.buffer_items)
    bw_out = [n for n in bw.graph.nodes if n.op == "output"][0].args[0]
    has_grad = [bw_out[i] is not None for i in range(n_params)]
    n_tangents = sum(1 for n in _placeholders(bw) if n.name.startswith("tangents"))
    if len(_placeholders(fw)) != n_params + n_buffers + len(jc.batch_leaves):
        raise RuntimeError(f"forward has {len(_placeholders(fw))} inputs, expected primals only")
    if n_tangents != 1:
        raise RuntimeError(f"backward takes {n_tangents} tangents, expected 1 (the loss)")
    train_names = [n for (n, _), h in zip(jc.param_items, has_grad, strict=True) if h]
    spec = OptimizerSpec("adamw", (GroupSpec(tuple(train_names), dict(OPTIMIZER_HYPER),
                                               ("decoupled_weight_decay",)),))

    def gradients(params: list[torch.Tensor], buffers: list[torch.Tensor],
                  leaves: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        outs = fw(*params, *buffers, *leaves)
        user, saved = outs[:num_fwd_outputs], outs[num_fwd_outputs:]
        loss = [o for o in user if o.dim() == 0 and o.is_floating_point()][-1]
        del outs, user
        grads = list(bw(*saved, torch.ones_like(loss))[:n_params])
        return loss, grads

    batch = pytree.tree_unflatten(list(jc.batch_leaves), jc.batch_spec)
    return capture_with_gradients(jc.inst.model, batch, gradients, spec)


def _timed(cell: Cell, make: Callable[[], tuple[Graph, list[int] | None]],
           profiles: tuple[str, ...] = PROFILES) -> Cell:
    try:
        t0 = time.perf_counter()
        g, order = make()
        cell.setup_seconds += time.perf_counter() - t0
        evaluate(cell, g, order, profiles)
    except Exception as e:  # noqa: BLE001 - a failing peer is a table cell, not a crash
        cell.error = fail_reason(e)
    return cell


def simulate_workload(inst: WorkloadInstance, tools: list[Tool], profiles: tuple[str, ...] = PROFILES,
                      eager_capture: Graph | None = None) -> list[Cell]:
    """One cell per tool for a paper-size workload, latency on `profiles`; `eager_capture`:
    the step's peakcut.capture when the caller already has it."""
    cells: list[Cell] = []
    compile_tools = [t for t in tools if t.family == "compile" and t.backend == "aot_eager"]
    joint: JointCapture | BaseException | None = None
    if compile_tools:
        try:
            joint = JointCapture(inst, compile_tools)
        except Exception as e:  # noqa: BLE001
            joint = e
    eager: list[Graph] = [] if eager_capture is None else [eager_capture]    # captured once

    def eager_graph() -> Graph:
        if not eager:
            eager.append(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
        return eager[0]

    for tool in tools:
        cell = Cell(inst.name, tool.name, tool.curve, "paper")
        if tool.family == "eager":
            _timed(cell, lambda: (eager_graph(), None), profiles)
        elif tool.family in ("checkpoint", "sac", "accumulate"):
            def make(cell: Cell = cell, tool: Tool = tool) -> tuple[Graph, None]:
                if tool.family == "accumulate":
                    g, cell.note = capture_accumulation(inst, tool.k, eager_graph())
                else:
                    g, cell.note = (capture_checkpointed if tool.family == "checkpoint" else capture_selective)(inst)
                return g, None
            _timed(cell, make, profiles)
        elif tool.family == "offload":
            try:
                t0 = time.perf_counter()
                evaluate_offload(cell, eager_graph(), profiles)
                cell.setup_seconds = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - a failing peer is a table cell, not a crash
                cell.error = fail_reason(e)
        elif tool.family == "peakcut":
            _timed(cell, lambda t=tool: peakcut_graph(t.limit, inst), profiles)
        elif tool.backend == "inductor":
            cell.error = f"not simulated: {INDUCTOR_REASON}"
        elif isinstance(joint, BaseException):
            cell.error = fail_reason(joint)
        else:
            assert joint is not None
            cell.setup_seconds = joint.seconds
            _timed(cell, lambda t=tool: (joint.graph(t), None), profiles)
        cells.append(cell)
    return cells
