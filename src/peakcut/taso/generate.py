"""The generator's pipeline, as TASO runs it: enumerate terms, group them by fingerprint into
candidate substitutions, drop renamed copies, prove each candidate, prune the redundant ones;
the result holds the rules and the counts of every step, in total and per op.

Within a group of terms with one fingerprint, each term (src) is paired with the group's
least (dst: fewest inputs, then fewest ops, then by text): every pair of the group follows
from two of those, so the star keeps TASO's all-pairs opportunities with linearly many
candidates. A member that lacks an input the least reads makes no candidate (counted).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from peakcut.taso.enumeration import enumerate_terms
from peakcut.taso.fingerprint import Fingerprinter
from peakcut.taso.ops import OPS, Op, Shape
from peakcut.taso.prune import Renaming, implied_by_common, implied_by_smaller
from peakcut.taso.ruleset import Rule, RuleSet
from peakcut.taso.term import Term, inp, input_names, nodes, size, text
from peakcut.taso.verify import BINDINGS, Verifier, float_exact

# The symbolic inputs: two matrices of one shape, two of a shape a matmul with them accepts.
INPUTS: Mapping[str, Shape] = {"a": (("m",), ("n",)), "b": (("m",), ("n",)),
                               "c": (("n",), ("k",)), "d": (("n",), ("k",))}
FINGERPRINT_BINDING: Mapping[str, int] = {"m": 3, "n": 4, "k": 5}
STEPS = ("enumerated", "candidates", "after renaming", "proved", "after pruning")


@dataclass
class Generated:
    """The rule set and what each step kept: `counts` per step, `per_op` per step and op,
    `unpaired` the fingerprint-equal terms that make no candidate (a member lacking an input
    of its group's least term), `rejected` the reasons candidates were not proved, `pruned`
    by pruning step, `seconds`."""

    rules: RuleSet
    counts: dict[str, int] = field(default_factory=dict)
    per_op: dict[str, Counter[str]] = field(default_factory=dict)
    unpaired: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    pruned: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)


def _ops(*terms: Term) -> set[str]:
    return {n[0] for t in terms for n in nodes(t)}


def _rank(t: Term) -> tuple[int, int, str]:
    return len(input_names(t)), size(t), text(t)


def _candidates(terms: list[Term], fp: Fingerprinter, max_ops: int,
                dropped: Counter[str]) -> list[tuple[Term, Term]]:
    """(src, dst) pairs of equal fingerprints: src a member of a group, dst its smallest."""
    groups: dict[tuple[object, ...], list[Term]] = {}
    for t in terms:
        key = fp.key(t, keep=size(t) < max_ops)
        if key is not None:
            groups.setdefault(key, []).append(t)
    pairs = []
    for members in groups.values():
        if len(members) > 1:
            ranked = sorted(members, key=_rank)
            least = set(input_names(ranked[0]))
            for m in ranked[1:]:
                if least <= set(input_names(m)):
                    pairs.append((m, ranked[0]))
                else:
                    dropped["inputs not nested"] += 1
    return pairs


def generate(inputs: Mapping[str, Shape] = INPUTS, max_ops: int = 3, seed: int = 0,
             limit: int | None = None, ops: Sequence[Op] = OPS,
             progress: Callable[[str], None] | None = None) -> Generated:
    """Enumerate, fingerprint, verify and prune. limit: only the first `limit` terms of the
    enumeration (a deterministic slice, for quick checks); ops: the vocabulary's ops used."""
    say = progress or (lambda s: None)
    clock = time.perf_counter()
    out = Generated(RuleSet([]))

    def step(name: str, items: Sequence[tuple[Term, ...]]) -> None:
        nonlocal clock
        now = time.perf_counter()
        out.seconds[name] = round(now - clock, 2)
        clock = now
        out.counts[name] = len(items)
        out.per_op[name] = Counter(o for it in items for o in _ops(*it))
        say(f"{name}: {len(items)} ({out.seconds[name]} s)")

    terms = enumerate_terms(inputs, max_ops, ops, limit=limit).terms
    step("enumerated", [(t,) for t in terms])
    leaves = [inp(n) for n in sorted(inputs)]      # a graph may equal an input
    pairs = _candidates(leaves + terms, Fingerprinter(inputs, FINGERPRINT_BINDING, seed), max_ops,
                        out.unpaired)
    step("candidates", pairs)

    renaming, seen, unique = Renaming(inputs), set(), []
    for src, dst in pairs:
        key = renaming.key(src, dst)
        if key not in seen:
            seen.add(key)
            unique.append((src, dst))
    step("after renaming", unique)

    verifier = Verifier(inputs)
    proved = []
    for src, dst in unique:
        verdict = verifier.prove(src, dst)
        if verdict.proved:
            proved.append((src, dst))
        else:
            out.rejected[verdict.kind] += 1
    step("proved", proved)

    cache: dict[tuple[Term, Term], bool] = {}

    def prove(a: Term, b: Term) -> bool:
        if (a, b) not in cache:
            cache[(a, b)] = verifier.prove(a, b).proved
        return cache[(a, b)]

    kept = []
    for src, dst in sorted(proved, key=lambda p: (size(p[0]) + size(p[1]), text(p[0]), text(p[1]))):
        if implied_by_smaller(src, dst, prove):
            out.pruned["implied by smaller"] += 1
        elif implied_by_common(src, dst, inputs):
            out.pruned["common sub-graph"] += 1
        else:
            kept.append((src, dst))
    step("after pruning", kept)

    rules = [Rule(f"r{i:04d}", src, dst, {n: inputs[n] for n in input_names(src)},
                  float_exact(src, dst)) for i, (src, dst) in enumerate(kept)]
    generator = {"inputs": {k: [list(d) for d in s] for k, s in sorted(inputs.items())},
                 "max_ops": max_ops, "seed": seed, "limit": limit,
                 "ops": [o.key for o in ops],
                 "fingerprint_binding": dict(FINGERPRINT_BINDING),
                 "verified_at": [dict(b) for b in BINDINGS],
                 "command": "python -m bench.taso"}
    out.rules = RuleSet(rules, generator, dict(out.counts))
    return out
