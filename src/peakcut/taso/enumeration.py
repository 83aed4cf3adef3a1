"""Enumeration: every graph of up to `max_ops` vocabulary ops over the symbolic inputs, built
as TASO builds them (add one op at a time, its arguments any input or earlier result, never an
op already in the graph on the same arguments), deduplicated by their node sets.

An identically zero sub(x, x) is left out (it only yields rules that restate x - x = 0 under
other ops). Only single-output graphs (terms) become substitutions; a partial graph with more open
results than the remaining ops can join is not extended. The order of the terms is a
function of the inputs, the ops and max_ops alone (no set or hash order), so a rerun
enumerates the same terms in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from peakcut.taso.ops import OPS, Op, Shape
from peakcut.taso.term import Term, inp, shape_of


@dataclass
class Enumeration:
    """The terms found, by op count, and how many graphs each level held."""

    terms: list[Term] = field(default_factory=list)
    graphs_per_level: list[int] = field(default_factory=list)
    terms_per_level: list[int] = field(default_factory=list)


def _degenerate(t: Term) -> bool:
    """sub(x, x): identically zero, it only makes rules that say so."""
    return t[0] == "sub" and t[1] == t[2]


def enumerate_terms(inputs: Mapping[str, Shape], max_ops: int = 3,
                    ops: Sequence[Op] = OPS, limit: int | None = None) -> Enumeration:
    """Every term of 1..max_ops ops over `inputs` (name -> symbolic shape). limit: stop after
    that many terms (a slice of the same order, for quick checks)."""
    if max_ops < 1:
        raise ValueError(f"max_ops must be at least 1, got {max_ops}")
    names = [inp(n) for n in sorted(inputs)]
    shapes: dict[Term, Shape | None] = {}
    result = Enumeration()
    level: list[tuple[tuple[Term, ...], tuple[Term, ...]]] = [((), ())]   # (nodes, open results)
    for size in range(1, max_ops + 1):
        seen: set[frozenset[Term]] = set()
        nxt: list[tuple[tuple[Term, ...], tuple[Term, ...]]] = []
        found = 0
        left = max_ops - size
        for nodes, sinks in level:
            have = set(nodes)
            avail = names + list(nodes)
            for o in ops:
                arg_lists: list[tuple[Term, ...]] = (
                    [(x,) for x in avail] if o.arity == 1
                    else [(x, y) for x in avail for y in avail])
                for args in arg_lists:
                    t: Term = (o.key, *args)
                    new_sinks = tuple(s for s in sinks if s not in args) + (t,)
                    if len(new_sinks) - 1 > left or t in have or _degenerate(t):
                        continue
                    if shape_of(t, inputs, shapes) is None:
                        continue
                    key = frozenset(have | {t})
                    if key in seen:
                        continue
                    seen.add(key)
                    if left:
                        nxt.append(((*nodes, t), new_sinks))
                    if len(new_sinks) == 1:
                        result.terms.append(t)
                        found += 1
                        if limit is not None and len(result.terms) >= limit:
                            result.graphs_per_level.append(len(seen))
                            result.terms_per_level.append(found)
                            return result
        result.graphs_per_level.append(len(seen))
        result.terms_per_level.append(found)
        level = nxt
    return result
