"""What a captured step says about the user's objects, and how it reads them at every call.

Shared by capture (which writes these descriptions), codegen and runtime (which read them
while a step runs) and the optimizer; it imports nothing of peakcut but `ir`.

- optimizers.py: the optimizer a step updates with (OptimizerSpec, its param groups), the
  SGD / Adam / AdamW recipes, and the description of a torch.optim optimizer.
- scalars.py: the values of the update's run-time scalars, read from the user's optimizer.
- tensor_kinds.py: which tensors a step can hold, and why a batch cannot be given to one.
- constants.py: the `const:` inputs' names and their binding to the user's tensors.
- data_parallel.py: a DistributedDataParallel step (its process group and buckets), read from
  the user's DDP module; fully_sharded.py: an FSDP2 step (its mesh and the parameters' full
  shapes), read from a module fully_shard was applied to.
"""
