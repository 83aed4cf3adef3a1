"""Tiny and medium sizes, measured on this CPU: one full training step per tool, real tensors.

Step = forward + loss + backward + AdamW(foreach=False) update + zero_grad(set_to_none);
gradient accumulation runs the batch as k micro-batches before its one update
(bench.peers.accumulate.accumulation_step).
Every tool gets its own deep copy of the workload's model and the same batch; optimizer
state is created by the warm-up steps (which also compile), so the measured window
starts and ends with the same caller-held bytes. Peak = peakcut's "cpu-profiler" method:
the running sum of the c10 CPU allocator's events under torch.profiler over one step,
plus the caller-held bytes. No TorchDispatchMode is ever put around compiled code.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from bench.peers.accumulate import BATCHNORM_NOTE, accumulation_step, has_batchnorm
from bench.peers.peakcut_hook import peakcut_step
from bench.peers.results import Cell, fail_reason
from bench.peers.tools import Tool, apply_checkpointing, apply_selective_checkpointing, fresh_dynamo
from peakcut.runtime import profiler_peak
from peakcut.workloads import WorkloadInstance

WARMUP = {"tiny": 3, "medium": 1}    # steps before timing (compilation, optimizer state)
SIMULATED_ONLY = "simulated only (peakcut.optimizer.baselines prices it; no runnable implementation here)"


def caller_held_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Any,
                      extra: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of distinct storages of parameters, buffers, optimizer state, the batch and
    `extra` (state a step holds itself)."""
    tensors = [*model.parameters(), *model.buffers(), *batch, *extra]
    for state in opt.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def build_step(tool: Tool, inst: WorkloadInstance) -> tuple[Callable[[], Any], torch.nn.Module,
                                                            torch.optim.Optimizer, str,
                                                            Callable[[], list[torch.Tensor]]]:
    """A fresh model copy, its AdamW and the zero-argument step for `tool`; a note; and the
    tensors the step itself holds between calls (peakcut's optimizer state)."""
    model = copy.deepcopy(inst.model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    batch = inst.batch
    note = ""
    if tool.family == "peakcut":
        step, held, note = peakcut_step(tool.limit, inst, model)
        return step, model, opt, note, held
    if tool.family == "offload":
        raise NotImplementedError(SIMULATED_ONLY)
    if tool.family == "accumulate":
        def accumulated() -> None:
            accumulation_step(model, batch, inst.loss_fn, opt, tool.k)

        note = f"micro-batch {inst.batch_size // tool.k}" + (f"; {BATCHNORM_NOTE}" if has_batchnorm(model) else "")
        return accumulated, model, opt, note, list
    if tool.family == "checkpoint":
        note = apply_checkpointing(inst.name, model)
    if tool.family == "sac":
        note = apply_selective_checkpointing(inst.name, model)
    if tool.family == "compile":
        loss_of = torch.compile(lambda b: inst.loss_fn(model, b), backend=tool.backend)
    else:
        def loss_of(b: Any) -> torch.Tensor:
            return inst.loss_fn(model, b)

    def step() -> None:
        loss = loss_of(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, opt, note, list


def on_device(inst: WorkloadInstance, device: str) -> WorkloadInstance:
    """The workload with a copy of its model and its batch on `device`."""
    model = copy.deepcopy(inst.model).to(device)
    batch = tuple(t.to(device) for t in inst.batch)
    return replace(inst, model=model, batch=batch)


def _cuda_seconds(step: Callable[[], Any]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _cuda_peak(step: Callable[[], Any]) -> int:
    """max_memory_allocated over one step: every byte on the device, caller-held included."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def measure_tool(tool: Tool, inst: WorkloadInstance, repeats: int = 7, peak_repeats: int = 2,
                 device: str = "cpu") -> Cell:
    """Warm up (compile), time `repeats` steps, then measure `peak_repeats` steps for the peak.

    CPU: wall time per step; peak = caller-held bytes + the allocator-event peak of a step.
    CUDA: CUDA-event time per step; peak = torch.cuda.max_memory_allocated over a step.
    """
    cell = Cell(inst.name, tool.name, tool.curve, inst.size)
    cuda = device.startswith("cuda")
    try:
        if cuda:
            inst = on_device(inst, device)
        with fresh_dynamo(), tool.config():
            t0 = time.perf_counter()
            step, model, opt, cell.note, held = build_step(tool, inst)
            for _ in range(WARMUP.get(inst.size, 3)):
                step()
            if cuda:
                torch.cuda.synchronize()
            cell.setup_seconds = time.perf_counter() - t0
            cell.baseline_bytes = (torch.cuda.memory_allocated() if cuda
                                   else caller_held_bytes(model, opt, inst.batch, held()))
            for _ in range(repeats):
                if cuda:
                    cell.times.append(_cuda_seconds(step))
                    continue
                t0 = time.perf_counter()
                step()
                cell.times.append(time.perf_counter() - t0)
            for _ in range(peak_repeats):
                if cuda:
                    cell.peaks.append(_cuda_peak(step))
                    continue
                delta, _ = profiler_peak(step)
                cell.peaks.append(cell.baseline_bytes + delta)
            cell.peak_bytes = max(cell.peaks)
    except Exception as e:  # noqa: BLE001 - a failing peer is a table cell, not a crash
        cell.error = fail_reason(e)
    return cell
