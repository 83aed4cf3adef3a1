"""Typed tags: what a node carries from the package that made it to the packages that read it.

A Node holds one NodeTags value (immutable, NO_TAGS when it carries nothing):

- fission (FissionTag): a node of a fission expansion (peakcut.fission.expand), from which
  codegen.fission rebuilds the loops and optimizer.compact prices compact expansions;
- remat (RematTag): a recompute, and the node it recomputes (peakcut.transform.remat);
- swap (SwapTag): a store or load of a swap, and the tensor swapped (peakcut.transform.swap);
- taso (TasoTag): a node a TASO-style rewrite made (peakcut.transform.taso);
- host (HostTag): a node of a parameter's update run on the host, or a copy it needs
  (peakcut.rules.host_update_rule); an "update" node runs on the host, on host tensors;
- fake_dtypes: per output, the dtype the fake kernel gives where capture corrected it to the
  real kernel's (peakcut.capture.convert);
- rewritten_from: the op a loss rewrite replaced (peakcut.fission.loss).

Tags are written to and read from the graph JSON by tags_to_json / tags_from_json (and from
the `extra` dicts of version-1 files by tags_from_extra). The tags are immutable records:
frozen dataclasses, but for FissionTag and NodeTags, made for every node of every fission
expansion, which are NamedTuples (three times faster to make).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

Path = tuple[tuple[int, int], ...]
"""Enclosing (F-Tree node id, part) pairs of a fission node, outermost first."""

FissionRole = Literal["part", "alloc", "slice", "contiguous", "merge", "keep"]
FISSION_ROLES: tuple[FissionRole, ...] = ("part", "alloc", "slice", "contiguous", "merge", "keep")


class FissionTag(NamedTuple):
    """A node of a fission expansion.

    region: the F-Tree node expanded. role: "part" for the copy of an original node in one
    part; "alloc" (preallocation of a boundary output), "slice" (a part's view of a whole
    tensor), "contiguous" (a dense copy of such a slice), "merge" (writing a part into a
    preallocated output, or the final division), "keep" (a compact expansion's keep-alive).
    path: the enclosing (region, part) pairs, outermost first; for the nodes of one part
    (copies, slices, per-part merges) it ends with (region, part). part, n: the part and the
    number of parts, where the node belongs to one part. of, label, component (copies only):
    the original node, its label of the D-Graph dimension, the D-Graph component.
    """

    region: int
    role: FissionRole
    path: Path = ()
    part: int | None = None
    n: int | None = None
    of: int | None = None
    label: str | None = None
    component: int | None = None


@dataclass(frozen=True, slots=True)
class RematTag:
    """A recompute of node `of` (the original stays in the graph unless nothing else reads it);
    `block`: the module of the block whose checkpoint made it (peakcut.transform.checkpoint),
    "" for the remat rule's."""

    of: int
    block: str = ""


@dataclass(frozen=True, slots=True)
class SwapTag:
    """A store (swap-out) or load (swap-in) of tensor `of`."""

    of: int


@dataclass(frozen=True, slots=True)
class TasoTag:
    """A node made by the TASO-style rule `rule`.

    A merged matmul (merge_matmuls) also says how it was merged: mode ("cols", "rows" or
    "sum"), the output sizes of the matmuls merged and their names (what split_matmul needs
    to un-merge it). A part of a split matmul (split_matmul) says which part it is and the
    name of the matmul split.
    """

    rule: str
    mode: str | None = None
    sizes: tuple[int, ...] = ()
    merged: tuple[str, ...] = ()
    part: int | None = None
    part_of: str | None = None


HostRole = Literal["update", "store", "upload"]
HOST_ROLES: tuple[HostRole, ...] = ("update", "store", "upload")


@dataclass(frozen=True, slots=True)
class HostTag:
    """A node of the host update of parameter `param` (its program input's tensor id).

    role: "update" for an op of the update, which runs on the host on host tensors; "store"
    for the copy of a device tensor the update reads (a gradient, a clipping coefficient, the
    parameter itself when it lives on the device); "upload" for the copy of the parameter's
    new value back into its device storage.
    """

    param: int
    role: HostRole


class NodeTags(NamedTuple):
    """Everything a node carries between packages (see module doc); NO_TAGS when nothing."""

    fission: FissionTag | None = None
    remat: RematTag | None = None
    swap: SwapTag | None = None
    taso: TasoTag | None = None
    fake_dtypes: tuple[str | None, ...] = ()
    rewritten_from: str | None = None
    host: HostTag | None = None

    def with_fission(self, fission: FissionTag) -> NodeTags:
        """These tags with `fission` as the fission tag (what a part copy of a node carries)."""
        return NodeTags(fission, self.remat, self.swap, self.taso, self.fake_dtypes,
                        self.rewritten_from, self.host)

    @property
    def on_host(self) -> bool:
        """The node runs on the host (an op of a host update), on host tensors."""
        return self.host is not None and self.host.role == "update"


NO_TAGS = NodeTags()


# ------------------------------------------------------------------ JSON
def tags_to_json(tags: NodeTags) -> dict[str, Any]:
    """The tags as a JSON object (only the tags present)."""
    doc: dict[str, Any] = {}
    if tags.fission is not None:
        f = tags.fission
        doc["fission"] = _without_none({
            "region": f.region, "role": f.role, "path": [list(p) for p in f.path], "part": f.part,
            "n": f.n, "of": f.of, "label": f.label, "component": f.component})
    if tags.remat is not None:
        doc["remat"] = {"of": tags.remat.of, **({"block": tags.remat.block} if tags.remat.block else {})}
    if tags.swap is not None:
        doc["swap"] = {"of": tags.swap.of}
    if tags.taso is not None:
        t = tags.taso
        doc["taso"] = _without_none({
            "rule": t.rule, "mode": t.mode, "sizes": list(t.sizes) or None,
            "merged": list(t.merged) or None, "part": t.part, "part_of": t.part_of})
    if tags.fake_dtypes:
        doc["fake_dtypes"] = list(tags.fake_dtypes)
    if tags.rewritten_from is not None:
        doc["rewritten_from"] = tags.rewritten_from
    if tags.host is not None:
        doc["host"] = {"param": tags.host.param, "role": tags.host.role}
    return doc


def tags_from_json(doc: Mapping[str, Any]) -> NodeTags:
    """Inverse of tags_to_json; raises ValueError (or KeyError/TypeError) on a malformed object."""
    unknown = set(doc) - {"fission", "remat", "swap", "taso", "fake_dtypes", "rewritten_from", "host"}
    if unknown:
        raise ValueError(f"unknown node tags {sorted(unknown)}")
    tags = NO_TAGS
    if "fission" in doc:
        tags = tags._replace(fission=_fission(doc["fission"]))
    if "remat" in doc:
        tags = tags._replace(remat=RematTag(int(doc["remat"]["of"]), str(doc["remat"].get("block", ""))))
    if "swap" in doc:
        tags = tags._replace(swap=SwapTag(int(doc["swap"]["of"])))
    if "taso" in doc:
        t = doc["taso"]
        tags = tags._replace(taso=TasoTag(
            str(t["rule"]), _opt_str(t.get("mode")), tuple(int(s) for s in t.get("sizes", ())),
            tuple(str(m) for m in t.get("merged", ())), _opt_int(t.get("part")),
            _opt_str(t.get("part_of"))))
    if "fake_dtypes" in doc:
        tags = tags._replace(fake_dtypes=tuple(_opt_str(d) for d in doc["fake_dtypes"]))
    if "rewritten_from" in doc:
        tags = tags._replace(rewritten_from=str(doc["rewritten_from"]))
    if "host" in doc:
        role = doc["host"]["role"]
        if role not in HOST_ROLES:
            raise ValueError(f"unknown host role {role!r}")
        tags = tags._replace(host=HostTag(int(doc["host"]["param"]), role))
    return tags


def tags_from_extra(extra: Mapping[str, Any]) -> NodeTags:
    """The tags of a node of a version-1 graph file, from its `extra` dict (string keys: "fission",
    "part", "of", "path", "n", "label", "component", "role"; "remat_of"; "swap_of"; "taso";
    "fake_dtypes"; "rewritten_from")."""
    tags = NO_TAGS
    if "fission" in extra:
        copy = "of" in extra
        tags = tags._replace(fission=_fission({
            "region": extra["fission"], "role": "part" if copy else extra["role"],
            "path": extra.get("path", ()), "part": extra.get("part"), "n": extra.get("n"),
            "of": extra.get("of"), "label": extra.get("label"), "component": extra.get("component")}))
    if "remat_of" in extra:
        tags = tags._replace(remat=RematTag(int(extra["remat_of"])))
    if "swap_of" in extra:
        tags = tags._replace(swap=SwapTag(int(extra["swap_of"])))
    if "taso" in extra:
        t = extra["taso"]
        merge = t.get("rule") == "merge_matmuls"
        tags = tags._replace(taso=TasoTag(
            str(t["rule"]), _opt_str(t.get("mode")), tuple(int(s) for s in t.get("sizes", ())),
            tuple(str(m) for m in t.get("of", ())) if merge else (), _opt_int(t.get("part")),
            None if merge or "of" not in t else str(t["of"])))
    if "fake_dtypes" in extra:
        tags = tags._replace(fake_dtypes=tuple(_opt_str(d) for d in extra["fake_dtypes"]))
    if "rewritten_from" in extra:
        tags = tags._replace(rewritten_from=str(extra["rewritten_from"]))
    return tags


def _fission(doc: Mapping[str, Any]) -> FissionTag:
    role = doc["role"]
    if role not in FISSION_ROLES:
        raise ValueError(f"unknown fission role {role!r}")
    path = tuple((int(f), int(k)) for f, k in doc.get("path", ()))
    return FissionTag(int(doc["region"]), role, path, _opt_int(doc.get("part")), _opt_int(doc.get("n")),
                      _opt_int(doc.get("of")), _opt_str(doc.get("label")),
                      _opt_int(doc.get("component")))


def _without_none(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not None}


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
