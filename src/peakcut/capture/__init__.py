"""Capture: an nn.Module + example batch (+ loss + optimizer) -> peakcut Graph.

One training step (forward, loss, backward, optimizer update) is traced with
make_fx over FakeTensors, so paper-size models trace without their memory.
Op set: the ATen ops eager PyTorch dispatches (after its implicit
decompositions), in-place ops included; see docs/ir.md for why not Core ATen.

    g = capture(model, batch, loss_fn, optimizer)

Files:
- step.py: capture() and describe_optimizer(): the checks, the trace (again with frozen
  parameters until every trainable one gets a gradient), the step's outputs and signature;
- training_step.py: the step function make_fx traces (forward, loss, backward, update) over
  fake parameters, buffers, optimizer slots and batch;
- binding.py: BoundModel, the user's module called with the traced parameters and buffers;
- control_edges.py: the control edges capture adds (random draws in order, updates after
  the loss, a GradScaler's gate);
- inputs.py, hooks.py, distributed.py: what the user's code holds, checked before tracing
  (the kinds of batch, parameters and buffers; hooks; DDP, FSDP, process groups);
- trace.py: make_fx over FakeTensors, recording each node's module, phase and list-op run
  (the generator-state calls through rng.py);
- rng.py: random generator state as part of the step;
- data_parallel.py: DDP's collectives traced into the step (buffers broadcast, gradients
  all-reduced in buckets); fully_sharded.py: FSDP2's (parameters all-gathered from their
  shards, gradients reduce-scattered and averaged, the clip's norm over every rank);
- real_layouts.py: kernels whose fake kernel keeps a layout the real kernel does not;
- specialize.py: data-dependent sizes (a boolean mask's index, nonzero, masked_select)
  specialised on the values seen at capture, guarded at run time;
- sparse.py: sparse COO/CSR matrices built in the step, their products with dense ones
  captured over their parts (peakcut::spmm);
- backward.py: the traced backward (the loss's gradients);
- update.py: the optimizer update as traced into the step (the for-loop's code, the clip,
  a GradScaler's unscale);
- list_update.py: torch.optim's foreach and fused updates, one call per tensor in the list
  ops' order, each tagged with its list op (ir.foreach);
- constants.py: closed-over tensors lifted as 'const:' inputs;
- module_state.py: tensors a forward stores on its modules, undone;
- convert.py: the FX graph -> Graph;
- realcheck.py: captured output dtypes checked against the real kernels;
- with_gradients.py: a step whose loss and gradients come from the caller's own function;
- errors.py: CaptureError.
"""

from __future__ import annotations

from peakcut.capture.binding import BoundModel
from peakcut.capture.errors import CaptureError
from peakcut.capture.step import capture, describe_optimizer
from peakcut.capture.with_gradients import capture_with_gradients
from peakcut.spec.optimizers import SGD, Adam, AdamW, GroupSpec, OptimizerSpec

__all__ = ["SGD", "Adam", "AdamW", "BoundModel", "CaptureError", "GroupSpec", "OptimizerSpec", "capture",
           "capture_with_gradients", "describe_optimizer"]
