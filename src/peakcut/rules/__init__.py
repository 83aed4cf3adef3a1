"""The rules of the search, one registry: every rule's way to find where it applies, why it
does not, how to apply and describe it, and the hooks placement and codegen need.

- protocol.py: the Rule protocols (RegionRule, ProgramRule, RewriteRule) and code hooks;
- registry.py: Registry and RULES, the one place rules are listed (one line each);
- hotspot.py: the memory hot-spot program rules are tried at;
- fission_rule.py, swap_rule.py (+ swap_code.py), remat_rule.py, taso_rules.py: the rules.

docs/rules.md says how to add a rule.
"""

from peakcut.rules.protocol import REWRITE_MOVES, ProgramRule, RegionRule, RewriteRule, Site
from peakcut.rules.registry import RULES, UNDO_MOVES, Candidate, Registry

__all__ = ["REWRITE_MOVES", "RULES", "UNDO_MOVES", "Candidate", "ProgramRule", "RegionRule", "Registry",
           "RewriteRule", "Site"]
