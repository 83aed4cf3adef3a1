"""Activation checkpointing of repeated blocks (a transformer's layers) as a rewrite of the step.

A block is the forward nodes of one repeated module (`model.layers.3`, `transformer.h.10`,
ResNet's bottleneck `layer2.1`, U-Net++'s `nodes.x1_0`: find_blocks). Checkpointing a block
gives its backward a recomputed copy of the block's forward: every backward node that read a
tensor the block's forward made reads the copy's tensor instead. The copies read the
block's inputs (the residual stream, parameters, masks, the rotary tables), are placed
together right before the first backward node that reads one of them, and carry a RematTag
naming the original (the generated code comments them as recomputes). The forward's own
tensors are then freed when the forward is done with them, as with
`torch.utils.checkpoint` around each block. Tensors a block hands to later forward nodes
(its output: the next block's input) are not recomputed: they are what is kept. Forward
nodes nothing reads any more (the detach of a tensor saved for the backward) are removed.

Unlike the remat program rule, this is a rewrite of the base graph (peakcut.rules
CheckpointBlocksRule): the copies become base nodes, so a fission region that spans the
blocks (micro-batching the whole step) splits them with the rest, and each part recomputes
its own rows.

Safety (docs/design.md: in-place updates, randomness), checked per block; a block that fails is left alone:
- every copied node is an op the registry knows, draws no random numbers, writes nothing in
  place and returns initialized memory; a training-mode batch norm is copied without its
  running statistics (remat.recompute_call): it gives the same outputs, and the statistics
  are updated once, by the forward, as in eager;
- no copied tensor is a program output or written in place by any node;
- every in-place writer of a storage the copies read (an optimizer update of a parameter)
  runs after the copies' place in the order and gets a control edge "after the copy".
Files:
- blocks.py: the repeated blocks of a step (find_blocks) and how their lists are named;
- plan.py: what a block's checkpoint copies and where, or why it cannot be done;
- apply.py: checkpoint_block(s), the rewrite;
- inverse.py: which blocks are checkpointed, and the rewrite that undoes a checkpoint;
- one_by_one.py: a rewrite applied item by item, composed into one.
"""

from peakcut.transform.checkpoint.apply import (
    checkpoint_block,
    checkpoint_blocks,
    why_not_checkpoint,
)
from peakcut.transform.checkpoint.blocks import Block, blocks_of, find_blocks
from peakcut.transform.checkpoint.inverse import (
    checkpointed_blocks,
    uncheckpoint_block,
    uncheckpoint_blocks,
    why_not_uncheckpoint,
)

__all__ = ["Block", "blocks_of", "checkpoint_block", "checkpoint_blocks", "checkpointed_blocks", "find_blocks",
           "uncheckpoint_block", "uncheckpoint_blocks", "why_not_checkpoint", "why_not_uncheckpoint"]
