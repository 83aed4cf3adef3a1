"""The search state (MAGIS §3 M-State): graph, F-Tree, schedule and simulation result.

A State keeps
- base: the step graph fission regions refer to (loss-detached capture, after any
  TASO-style rewrites), with its order, F-Tree and D-Graph;
- recipes: the program-rule applications (remat, swap, ...: peakcut.rules) made on top
  of the fissioned program, in the ids of nodes outside every enabled region (rules never
  cross a region's boundary), so that they can be replayed when the F-Tree changes;
- program/order: what runs (the base with its enabled regions expanded into their
  parts, then the recipes applied), and its simulated peak and latency; in a compact
  state (`compact`), part 0 of each region only, priced per part (optimizer.compact),
  which Deriver.exact turns into the program that runs;
- pending: a TASO-style rewrite made on the program only (outside every region and
  recipe); base, F-Tree and D-Graph are still the parent's until Deriver.resolve rewrites
  the base and updates the F-Tree (MAGIS Algorithm 3, line 16: when the state is expanded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peakcut.fission.dgraph import DGraph
from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.node_cache import NodeCache

if TYPE_CHECKING:
    from peakcut.transform.site import RewriteSite


@dataclass(frozen=True)
class Recipe:
    """One application of a program rule (peakcut.rules.ProgramRule) at a site: the tensor,
    the node that makes it and the users the rule redirects (base ids), and what it does in
    words. `copies_of` names base nodes whose recomputes (remat copies, which the base does not
    have) are users too: a swap of a ReLU's output that a recomputed convolution reads in the
    backward. Their ids are looked up in the program each time the recipe is applied
    (optimizer.derive.resolved), since a replay after a fission change gives the copies other ids."""

    kind: str                  # the rule's kind: "swap", "remat", ...
    tensor: int
    node: int
    users: tuple[int, ...]
    description: str
    copies_of: tuple[int, ...] = ()


@dataclass(frozen=True)
class PendingRebase:
    """A TASO-style site applied to a state's program but not yet to its base: the base it is
    to be applied to (the parent's), that base's order and digest, and the site."""

    base: Graph
    base_order: tuple[int, ...]
    base_digest: str
    site: RewriteSite


@dataclass
class State:
    base: Graph
    base_order: list[int]
    tree: FTree
    dgraph: DGraph                            # the base's D-Graph (what the tree's regions split)
    recipes: tuple[Recipe, ...]
    program: Graph
    order: list[int]
    peak_bytes: int
    latency_s: float
    applied: tuple[str, ...]                  # the search's path to it, oldest first: every move,
    # undos and recipes dropped on the way included (for the report)
    digest: str                               # computation hash of the program
    depth: int = 0
    base_digest: str = ""                     # computation hash of the base ("": not known)
    compact: bool = False                     # program is a compact expansion (Deriver.exact)
    pending: PendingRebase | None = None      # base not rewritten yet (Deriver.resolve)
    compact_estimate: tuple[int, float] | None = None   # re-derived by Deriver.exact from a compact
    # state: that state's (peak, latency); None otherwise
    narrow_waist: dict[int, int] | None = field(default=None, repr=False, compare=False)   # the
    # program's narrow-waist values, computed once (Deriver.rescheduled)
    rewrites: tuple[str, ...] = ()            # the rewrites that made `base` from the capture, oldest
    # first; with the enabled F-Tree nodes and the recipes, what the plan does

    def fission(self) -> tuple[tuple[int, int], ...]:
        """(F-Tree node, n) of every enabled node."""
        return tuple((f.id, f.n) for f in self.tree.enabled())


def computation_hash(g: Graph, order: list[int] | None = None) -> str:
    """A hash of what the graph computes: equal hashes mean the same ops on the same values.

    Tensors are named by how they are computed (Merkle style: the producer's op, its
    arguments' hashes, scalars and the output index; program inputs by their name), and
    the graph by the sorted multiset of node hashes. Node ids, order, names and modules
    do not enter; control edges do (they order in-place writes). Part copies of a
    fissioned region differ in their slice arguments, so fission numbers are visible.

    A node's hash is blake2b of repr((op, args, kwargs, control)) with every tensor
    argument replaced by its tensor's hash, every other value by its repr, lists by
    tuples and dicts by their sorted (key, value) pairs. The text around the tensor
    hashes depends on the node alone, so it is built once per node object (_hash_template);
    a node object hashed again with the same tensor and control hashes (a graph derived
    from one hashed before) reuses its last hash.
    """
    order = list(g.order if order is None else order)
    tensor_hash: dict[int, str] = {t: f"in:{name}" for t, name in zip(g.inputs, g.input_names, strict=True)}
    tensor_text = {t: repr(h) for t, h in tensor_hash.items()}   # repr(tensor_hash[t])
    node_hash: dict[int, str] = {}
    nodes = g.nodes
    control = g.control
    blake2b = hashlib.blake2b
    entry_of = _HASHED.entries().get      # id(node) -> (depends, value, ref): the hot loop's lookup
    for nid in order:
        node = nodes[nid]
        entry = entry_of(id(node))
        hashed = entry[1] if entry is not None else None     # put with no depends and no slot
        if hashed is None:
            hashed = _Hashed(_hash_template(node))
            _HASHED.put(node, hashed)
        text, tensors = hashed.template
        texts = tuple(map(tensor_text.get, tensors))
        if None in texts:   # a tensor no node (before this one) makes
            texts = tuple(tensor_text.get(t) or repr(f"?{t}") for t in tensors)
        deps = control.get(nid)
        tail = repr(tuple(sorted(node_hash.get(c, "?") for c in deps))) + ")" if deps else "())"
        last = hashed.last
        if last is not None and last[0] == texts and last[1] == tail:
            h, outs = last[2], last[3]   # the same key as last time: the same hash
        else:
            key = (text.format(*texts) if tensors else text) + tail
            h = blake2b(key.encode(), digest_size=16).hexdigest()
            # each output's hash and its repr (hex digits, a colon and digits: plain quotes)
            outs = tuple((t, f"{h}:{i}", f"'{h}:{i}'") for i, t in enumerate(node.outputs)
                         if t is not None)
            hashed.last = (texts, tail, h, outs)
        node_hash[nid] = h
        for t, raw, quoted in outs:
            tensor_hash[t] = raw
            tensor_text[t] = quoted
    outputs = tuple(tensor_hash.get(t, "?") for t in g.outputs)
    whole = repr((sorted(node_hash.values()), outputs))
    return hashlib.blake2b(whole.encode(), digest_size=16).hexdigest()


class _Hashed:
    """What computation_hash keeps per node object: its template (_hash_template, a function of
    the node alone) and its last hash with the key it had: (texts of its tensor arguments'
    hashes, control part, node hash, (output tensor, hash, quoted hash) per output)."""

    __slots__ = ("template", "last")

    def __init__(self, template: tuple[str, tuple[int, ...]]) -> None:
        self.template = template
        self.last: tuple[tuple[str | None, ...], str, str, tuple[tuple[int, str, str], ...]] | None = None


_HASHED: NodeCache[_Hashed] = NodeCache()
"""node -> its _Hashed record (computation_hash)."""


def _hash_template(node: Node) -> tuple[str, tuple[int, ...]]:
    """The text of a node's key up to its control part, and the ids of its tensor arguments in
    order. With tensor arguments the text is a str.format template with a {} where
    repr(each one's hash) goes; without, the text itself."""
    tensors: list[int] = []
    text = "(" + _braces(repr(node.op)) + ", " + _template_of(node.args, tensors) + ", "
    text += _template_of(node.kwargs, tensors) + ", "
    return (text, tuple(tensors)) if tensors else (text.format(), ())


def _template_of(value: Any, tensors: list[int]) -> str:
    """repr(v) as a template, v being what the hash puts in place of `value`: the tensor's
    hash for a TensorRef (a {}), a tuple for a list or tuple, the sorted (key, value) pairs
    for a dict (its keys are distinct, so they alone decide the order), else repr(value)."""
    if isinstance(value, (list, tuple)):
        parts: list[str] = []
        for v in value:   # the common element types inline, the others by recursion
            kind = type(v)
            if kind is TensorRef:
                tensors.append(v.id)
                parts.append("{}")
            elif kind in _PLAIN:
                parts.append("'" + repr(v) + "'")
            else:
                parts.append(_template_of(v, tensors))
        return "(" + ", ".join(parts) + (",)" if len(parts) == 1 else ")")
    if type(value) in _PLAIN:
        return "'" + repr(value) + "'"
    if isinstance(value, TensorRef):
        tensors.append(value.id)
        return "{}"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0])
        inner = ", ".join(["(" + _braces(repr(k)) + ", " + _template_of(v, tensors) + ")"
                           for k, v in items])
        return "(" + inner + (",)" if len(items) == 1 else ")")
    return _braces(repr(repr(value)))


_PLAIN = frozenset({int, bool, type(None)})
"""Types whose repr is plain ASCII without quotes, backslashes or braces: repr(repr(x)) is
"'" + repr(x) + "'"."""


def _braces(text: str) -> str:
    """`text` as a literal part of a str.format template."""
    return text.replace("{", "{{").replace("}", "}}") if "{" in text or "}" in text else text
