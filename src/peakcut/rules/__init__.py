"""The rules of the search, one registry: every rule's way to find where it applies, why it
does not, how to apply and describe it, and the hook placement needs (codegen needs none).
Each rule file is an adapter of a body in peakcut.transform.

- base.py: the abstract base class of each family (RegionRule, ProgramRule, RewriteRule) and
  apply_in_one_edit;
- query.py: Query, what every family's `sites` and `describe` read;
- phase.py: Phase, the phases a rewrite rule runs in (ROOT, SEARCH, REGIONS, POLISH);
- registry.py: Registry and RULES, the one place rules are listed (one line each);
- hotspot.py: the memory hot-spot program rules are tried at;
- fission_rule.py: the region rule (F-Tree mutations);
- swap_rule.py, remat_rule.py, regather_rule.py, offload_state_rule.py, offload_param_rule.py,
  host_update_rule.py: the program rules;
- taso_rules.py (merge_matmuls, split_matmul, drop_identity, cancel_transposes, fold_views),
  conv_cat_rule.py, conv_grads_rule.py, checkpoint_rule.py (checkpoint_blocks,
  uncheckpoint_blocks), checkpoint_segments_rule.py, activations_rule.py, attention_rule.py
  (recompute_attention), spatial_rule.py
  (split_rows), batch_norm_rule.py (split_batch_norms), vertex_ranges_rule.py
  (split_vertex_ranges): the rewrite rules;
- generated_rule.py (generated): the generated substitutions of peakcut.taso as one rewrite
  rule; fused_attention_rule.py (fused_attention): written-out attention as the fused kernel,
  and chunked_loss_rule.py (chunked_loss): a language model's head and loss in chunks of the
  sequence, both opt-in (registry.py's WITH_FUSED).

docs/rules.md says how to add a rule.
"""

from peakcut.rules.base import REWRITE_MOVES, ProgramRule, RegionRule, RewriteRule, Site
from peakcut.rules.registry import RULES, UNDO_MOVES, WITH_FUSED, Candidate, Registry

__all__ = ["REWRITE_MOVES", "RULES", "UNDO_MOVES", "Candidate", "ProgramRule", "RegionRule", "Registry",
           "RewriteRule", "Site", "WITH_FUSED"]
