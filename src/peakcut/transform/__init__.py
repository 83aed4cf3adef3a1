"""Graph transformations: the body of every rule of the search and what every rule shares
(Rewrite, RuleError, RewriteSite). Every body is a pure function (Graph, order, ...) -> Rewrite
with a why_not_* twin that says why it does not apply (None when it does). Where the search
tries them, and where the nodes they add go: the rule adapters and the registry, peakcut.rules.

Files:
- rewrite.py: Rewrite, RuleError, the rewritten_from tag and the graph helpers the rules
  share; site.py: where a
  rewrite of the base graph applies (RewriteSite);
- remat.py: re-materialization and its dual; remat_chain.py: remat with the inputs only
  its recompute keeps alive; activations.py: cheap saved activations recomputed;
  attention.py: attention's scores, from their matmul to the softmax, as units to recompute;
- fused_attention.py: written-out attention run as the fused attention kernel PyTorch picks;
- head_loss.py: a language model's vocabulary projection, log-softmax and cross-entropy with
  their backward, as one unit; chunked_loss.py: that unit run in chunks of the sequence;
- swap.py: swapping to host memory and back, and its dual;
- regather.py: an FSDP2 parameter gathered again from its shard for its later readers;
- offload_state.py, offload_param.py: optimizer state and parameters kept in host memory
  between steps; host_input.py: what both need of the input; host_update.py: a parameter's update run on the host;
- batch_norm.py: training-mode batch norm as ops a batch split can cross;
- vertex_ranges.py: a GNN's sums over edges (gather, per-edge ops, index_add) run in edge ranges;
- checkpoint/: activation checkpointing of repeated blocks, and its inverse;
  checkpoint_segments.py: the forward ops outside the blocks, as units to checkpoint;
- spatial/: spatial fission, a region split along its images' rows;
- taso/: TASO-style rewrites of the base graph.
"""

from peakcut.transform.remat import deremat, remat, why_not_deremat, why_not_remat
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.swap import deswap, swap, why_not_deswap, why_not_swap

__all__ = [
    "Rewrite", "RuleError", "deremat", "deswap", "remat", "swap", "why_not_deremat", "why_not_deswap",
    "why_not_remat", "why_not_swap",
]
