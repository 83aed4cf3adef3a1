"""Code generation: a graph and an order become a readable, runnable PyTorch program.

Codegen reads the graph only (its ops and node tags); it imports no rule.

- source.py: generate_source, the program's text (header, signature, body), and its names;
- contents.py: the table of contents in the program's docstring;
- emitter.py: the step's body: calls, loops, dels, inputs bound at first use;
- fission.py: the loop plan of a fissioned graph (which regions run as loops, and how);
- calls.py: one op call as source;
- step_inputs.py: the step's four input mappings (params, buffers, state, batch);
- hooks.py: CodeHook and NodeCode, how code other than an op call reaches the step;
- builtin_code.py: the hooks of the nodes peakcut's transformations add;
- swap_code.py, recompute_code.py, input_copy_code.py, host_update_code.py: those hooks
  (swaps, recomputes, copies of inputs kept in host memory, updates on the host);
- foreach_code.py: the hook writing runs of an update's per-tensor calls back as one
  torch._foreach_* or fused call;
- update_progress.py: the flag that tells a failure after the update began (PartialUpdateError);
- swap.py: HostPool, the host memory of swaps and host-kept inputs at run time;
- host_worker.py: HostWorker, the host stream that runs updates on the host;
- update_inputs.py: binding the user's optimizer, its state and hyper-parameters at each call;
- arena.py: Placement, where placed results lie in the step's arena, and their views' source;
- arena_plan.py: plan_arena, which results a step places in its arena (offsets from
  peakcut.memory.layout), its source, and the unplanned remainder with its bytes and why;
- out_variants.py: an op's out overload (or in-place form) that writes into a given tensor;
- arena_probe.py: the probe on the device that refuses an out overload which computes
  elsewhere and copies, or re-allocates the given tensor;
- program.py: Step, the generated program written, loaded and called on a model.
"""

from peakcut.codegen.program import Step, StepBindingError, default_program_dir
from peakcut.codegen.source import generate_source
from peakcut.codegen.update_progress import PartialUpdateError

__all__ = ["PartialUpdateError", "Step", "StepBindingError", "default_program_dir", "generate_source"]
