"""DimRule: how one node's tensors line up along named axes (einsum-like).

A rule names every dimension of every tensor a node reads and writes with a
*label* local to the node ("b", "m", "k", "d0", ...) or None. Splitting the
node along label L into n parts means:

- every tensor dimension labelled L is cut into n contiguous, equal slices
  (part p gets slice p); tensors without L are passed whole to every part;
- size-like arguments (``DimRule.args``) whose entries carry L are divided by n;
- every output is rebuilt from the n part results as ``DimRule.combine(L)`` says:
  concatenated along its L dimension (``"cat"``), combined with ``merge[L]``
  (the output is a partial result of each part, e.g. the sum over a split
  reduce axis), or taken from part 0 (``"same"``: the output does not depend
  on L and every part computes the same value).

A label may carry dimensions of different lengths: a reshape links the
outermost dimensions of a merged block ([B, T] -> [B*T] labels both B and B*T),
because the first p/n of a row-major block is the first p/n of its outermost
dimension. A split by n is valid iff n divides every length (and every size
argument entry) that carries the label (see ``split.label_sizes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Label = str
Dims = tuple[Label | None, ...]

CAT = "cat"
"""combine(): the output holds the label; parts are concatenated along it."""
SAME = "same"
"""combine(): the output does not depend on the label; part 0's value is used."""

MERGE_KINDS: Mapping[str, str] = MappingProxyType({
    "sum": "sum of the parts (sum over a split axis, matmul k, weight gradients)",
    "mean": "sum of the parts divided by n (mean over a split axis: equal counts per part)",
    "amax": "element-wise maximum of the parts",
    "amin": "element-wise minimum of the parts",
    "prod": "product of the parts",
    "any": "logical or of the parts",
    "all": "logical and of the parts",
    "logsumexp": "log(sum(exp(part))) over the parts",
    "nll_mean": (
        "nll_loss(2d)_forward with reduction=mean: every part runs with reduction=sum "
        "(split_node_args rewrites it); total_weight = sum of parts, "
        "output = sum of parts / total_weight (exact even when ignore_index or class "
        "weights make the parts' weights differ)"
    ),
})
"""How partial results of a split along a label combine, by merge kind."""


@dataclass(frozen=True)
class DimRule:
    """How one node's tensors line up along named axes (einsum-like).

    inputs: per tensor in ``node.input_ids()`` order, one entry per dimension:
    a label, or None when the dimension is never split (broadcast size-1 dim,
    sliding-window dim, softmax/normalization dim, gathered dim, ...).
    outputs: per entry of ``node.outputs`` (an output that is None gets ()).
    args: size-like non-tensor arguments by schema name: per entry, the label
    whose length it carries (None: not touched); a single int argument is a
    1-tuple. Splitting a label by n divides the entries that carry it by n.
    merge: for labels that some output lacks while it depends on them (reduce
    labels and e.g. the batch of a weight gradient): how part results combine
    (a key of MERGE_KINDS). Only exactly mergeable labels are listed; a label
    that cannot be merged exactly is not a label at all.
    """

    inputs: tuple[Dims, ...]
    outputs: tuple[Dims, ...]
    args: Mapping[str, Dims] = field(default_factory=dict)
    merge: Mapping[Label, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in self.merge.values():
            if kind not in MERGE_KINDS:
                raise ValueError(f"unknown merge kind {kind!r}; known: {sorted(MERGE_KINDS)}")
        for dims in (*self.inputs, *self.outputs):
            named = [d for d in dims if d is not None]
            if len(named) != len(set(named)):
                raise ValueError(f"a label occurs twice in one tensor: {dims}")
        tensor_labels = self.labels()
        for name, dims in self.args.items():
            stray = {d for d in dims if d is not None} - tensor_labels
            if stray:
                raise ValueError(f"argument {name!r} carries labels no tensor has: {sorted(stray)}")
        stray_merge = set(self.merge) - tensor_labels
        if stray_merge:
            raise ValueError(f"merge names labels no tensor has: {sorted(stray_merge)}")
        unmerged = self.reduce() - set(self.merge)
        if unmerged:
            raise ValueError(f"reduce labels without a merge kind: {sorted(unmerged)}")

    def __reduce__(self) -> tuple[type[DimRule], tuple[Any, ...]]:
        """Pickle the mappings as dicts (read-only views of them do not pickle)."""
        return (DimRule, (self.inputs, self.outputs, dict(self.args), dict(self.merge)))

    def __hash__(self) -> int:
        return hash((self.inputs, self.outputs, tuple(sorted(self.args.items())),
                     tuple(sorted(self.merge.items()))))

    def labels(self) -> set[Label]:
        """Every label of the rule (on some input or output tensor)."""
        return {d for dims in (*self.inputs, *self.outputs) for d in dims if d is not None}

    def spatial(self) -> set[Label]:
        """Labels that some output carries."""
        return {d for dims in self.outputs for d in dims if d is not None}

    def reduce(self) -> set[Label]:
        """Labels carried by some input and by no output."""
        return self.labels() - self.spatial()

    def combine(self, label: Label) -> tuple[str, ...]:
        """Per output: how the parts of a split along `label` rebuild it.

        ``"cat"`` (the output has the label), a merge kind (it lacks the label
        and is a partial result), or ``"same"`` (it lacks the label and every
        part computes the same value; the first part's is used).
        """
        if label not in self.labels():
            raise ValueError(f"{label!r} is not a label of this rule")
        kind = self.merge.get(label, SAME)
        return tuple(CAT if label in dims else kind for dims in self.outputs)

    def drop(self, labels: set[Label]) -> DimRule:
        """The same rule with `labels` replaced by None everywhere (never splittable)."""
        if not labels:
            return self

        def strip(dims: Dims) -> Dims:
            return tuple(None if d in labels else d for d in dims)

        return DimRule(
            inputs=tuple(strip(d) for d in self.inputs),
            outputs=tuple(strip(d) for d in self.outputs),
            args=MappingProxyType({k: strip(v) for k, v in self.args.items()}),
            merge=MappingProxyType({k: v for k, v in self.merge.items() if k not in labels}),
        )
