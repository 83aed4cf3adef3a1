"""Typed tags: what a node carries from the package that made it to the packages that read it.

A Node holds one NodeTags value (immutable, NO_TAGS when it carries nothing): an open mapping
from a tag's class to the tag, at most one tag of each kind. A kind is a subclass of Tag with
its own `kind` name, registered when its module is imported (Tag.__init_subclass__; a second
class under a kind already taken raises TypeError), which writes itself to the graph JSON
(to_json / from_json) under that name. A rule that needs a tag of its own defines its kind in
its own module: nothing here names it.

The kinds defined here are the ones the packages below the rules read (the code generator,
the memory model, fission):
- fission (FissionTag): a node of a fission expansion (peakcut.fission.expand), from which
  codegen.fission rebuilds the loops and optimizer.compact prices compact expansions;
- remat (RematTag): a recompute, and the node it recomputes (peakcut.transform.remat);
- swap (SwapTag): a store or load of a swap, and the tensor swapped (peakcut.transform.swap);
- host (HostTag): a node of a parameter's update run on the host, or a copy it needs
  (peakcut.transform.host_update); an "update" node runs on the host, on host tensors
  (NodeTags.on_host);
- named_rows (NamedRowsTag): how many rows of its destination an in-place index_add_'s index
  names in the data its plan was made for (peakcut.transform.vertex_ranges), which the cost
  models price.
Others live with their makers: taso (peakcut.transform.taso.tag), rewritten_from
(peakcut.transform.rewrite), fake_dtypes (peakcut.capture.convert).

Tags are written to and read from the graph JSON by tags_to_json / tags_from_json, and read
from the `extra` dicts of version-1 files by tags_from_extra (each kind's from_extra). Tags
are immutable records: frozen dataclasses, but for FissionTag, made for every node of every
fission expansion, which is a NamedTuple (three times faster to make).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, TypeVar

T = TypeVar("T", bound="Tag")

_KINDS: dict[str, type[Tag]] = {}   # filled as tag classes are defined (import time only)


class Tag(ABC):
    """A kind of node tag (module doc). A subclass sets `kind` (its JSON name) and writes
    to_json and from_json; a class without its own `kind` is not registered (a base of kinds)."""

    __slots__ = ()
    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is None:
            return
        known = _KINDS.get(kind)
        # a slotted dataclass is made twice, under one name: the second class replaces the first
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"node tag kind {kind!r} is {known.__module__}.{known.__qualname__}'s already")
        _KINDS[kind] = cls

    @property
    def on_host(self) -> bool:
        """The node runs on the host, on host tensors (NodeTags.on_host)."""
        return False

    @abstractmethod
    def to_json(self) -> Any:
        """The tag as a JSON value."""

    @classmethod
    @abstractmethod
    def from_json(cls: type[T], doc: Any) -> T:
        """Inverse of to_json; raises ValueError (or KeyError/TypeError) on a malformed value."""

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Tag | None:
        """The tag of this kind in the `extra` dict of a node of a version-1 graph file (None:
        none there; kinds newer than version 1 have none)."""
        return None


class NodeTags(dict):  # type: ignore[type-arg]
    """Everything a node carries between packages (module doc): at most one tag per kind,
    looked up by the tag's class (get). NO_TAGS when nothing.

    A read-only dict from tag class to tag, so that `get` is the dict's own (every node of
    every fission expansion is asked for its tags many times per state); iterating gives the
    tags, as a collection of tags would."""

    __slots__ = ("on_host",)
    on_host: bool
    """The node runs on the host (an op of a host update), on host tensors."""

    def __init__(self, *tags: Tag) -> None:
        if len(tags) == 1:      # the common case, made for every node of every fission expansion
            (tag,) = tags
            dict.__setitem__(self, type(tag), tag)
            self.on_host = tag.on_host
            return
        for tag in tags:
            dict.__setitem__(self, type(tag), tag)
        if dict.__len__(self) != len(tags):
            raise ValueError(f"two node tags of one kind: {tags}")
        self.on_host = any(tag.on_host for tag in tags)

    if TYPE_CHECKING:   # at run time `get` is the dict's own, the cheapest lookup there is
        def get(self, kind: type[T], default: None = None) -> T | None:  # type: ignore[override]
            """The tag of this class, or None."""

    def with_tag(self, tag: Tag) -> NodeTags:
        """These tags with `tag` in place of the one of its kind (what a part copy of a node
        carries: its own tags and its fission tag)."""
        new = NodeTags.__new__(NodeTags)
        dict.update(new, self)
        dict.__setitem__(new, type(tag), tag)
        new.on_host = any(t.on_host for t in dict.values(new)) if self.on_host else tag.on_host
        return new

    def without(self, kind: type[Tag]) -> NodeTags:
        """These tags less the one of class `kind` (themselves when they have none)."""
        if kind not in self:
            return self
        return NodeTags(*(t for k, t in dict.items(self) if k is not kind))

    def __iter__(self) -> Iterator[Tag]:
        return iter(dict.values(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeTags) and dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(dict.values(self)))

    def __repr__(self) -> str:
        return f"NodeTags({', '.join(map(repr, dict.values(self)))})"

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("NodeTags are read-only: use with_tag or without")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeTags, tuple(dict.values(self)))


NO_TAGS = NodeTags()


# ------------------------------------------------------------------ the kinds below the rules
Path = tuple[tuple[int, int], ...]
"""Enclosing (F-Tree node id, part) pairs of a fission node, outermost first."""

FissionRole = Literal["part", "alloc", "slice", "contiguous", "merge", "keep"]
FISSION_ROLES: tuple[FissionRole, ...] = ("part", "alloc", "slice", "contiguous", "merge", "keep")


class _FissionFields(NamedTuple):
    region: int
    role: FissionRole
    path: Path = ()
    part: int | None = None
    n: int | None = None
    of: int | None = None
    label: str | None = None
    component: int | None = None


class FissionTag(_FissionFields, Tag):
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

    __slots__ = ()
    kind = "fission"

    def to_json(self) -> dict[str, Any]:
        return without_none({
            "region": self.region, "role": self.role, "path": [list(p) for p in self.path],
            "part": self.part, "n": self.n, "of": self.of, "label": self.label,
            "component": self.component})

    @classmethod
    def from_json(cls, doc: Any) -> FissionTag:
        role = doc["role"]
        if role not in FISSION_ROLES:
            raise ValueError(f"unknown fission role {role!r}")
        path = tuple((int(f), int(k)) for f, k in doc.get("path", ()))
        return cls(int(doc["region"]), role, path, opt_int(doc.get("part")), opt_int(doc.get("n")),
                   opt_int(doc.get("of")), opt_str(doc.get("label")), opt_int(doc.get("component")))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FissionTag | None:
        if "fission" not in extra:
            return None
        copy = "of" in extra
        return cls.from_json({
            "region": extra["fission"], "role": "part" if copy else extra["role"],
            "path": extra.get("path", ()), "part": extra.get("part"), "n": extra.get("n"),
            "of": extra.get("of"), "label": extra.get("label"), "component": extra.get("component")})


@dataclass(frozen=True, slots=True)
class RematTag(Tag):
    """A recompute of node `of` (the original stays in the graph unless nothing else reads it);
    `block`: the module of the block whose checkpoint made it (peakcut.transform.checkpoint),
    "" for the remat rule's."""

    kind: ClassVar[str] = "remat"
    of: int
    block: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"of": self.of, **({"block": self.block} if self.block else {})}

    @classmethod
    def from_json(cls, doc: Any) -> RematTag:
        return cls(int(doc["of"]), str(doc.get("block", "")))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> RematTag | None:
        return cls(int(extra["remat_of"])) if "remat_of" in extra else None


@dataclass(frozen=True, slots=True)
class SwapTag(Tag):
    """A store (swap-out) or load (swap-in) of tensor `of`."""

    kind: ClassVar[str] = "swap"
    of: int

    def to_json(self) -> dict[str, Any]:
        return {"of": self.of}

    @classmethod
    def from_json(cls, doc: Any) -> SwapTag:
        return cls(int(doc["of"]))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> SwapTag | None:
        return cls(int(extra["swap_of"])) if "swap_of" in extra else None


@dataclass(frozen=True, slots=True)
class NamedRowsTag(Tag):
    """An in-place index_add_ whose index names `rows` distinct rows of its destination in the
    data its plan was made for (a part of a sum over edges grouped by destination: the part's
    vertices). The kernel reads and writes those rows only, so the cost models price them
    (cost.calls); the result never depends on it, since the call still adds into the whole
    destination."""

    kind: ClassVar[str] = "named_rows"
    rows: int

    def to_json(self) -> int:
        return self.rows

    @classmethod
    def from_json(cls, doc: Any) -> NamedRowsTag:
        return cls(int(doc))


HostRole = Literal["update", "store", "upload"]
HOST_ROLES: tuple[HostRole, ...] = ("update", "store", "upload")


@dataclass(frozen=True, slots=True)
class HostTag(Tag):
    """A node of the host update of parameter `param` (its program input's tensor id).

    role: "update" for an op of the update, which runs on the host on host tensors; "store"
    for the copy of a device tensor the update reads (a gradient, a clipping coefficient, the
    parameter itself when it lives on the device); "upload" for the copy of the parameter's
    new value back into its device storage.
    """

    kind: ClassVar[str] = "host"
    param: int
    role: HostRole

    @property
    def on_host(self) -> bool:
        return self.role == "update"

    def to_json(self) -> dict[str, Any]:
        return {"param": self.param, "role": self.role}

    @classmethod
    def from_json(cls, doc: Any) -> HostTag:
        role = doc["role"]
        if role not in HOST_ROLES:
            raise ValueError(f"unknown host role {role!r}")
        return cls(int(doc["param"]), role)


# ------------------------------------------------------------------ JSON
def tags_to_json(tags: NodeTags) -> dict[str, Any]:
    """The tags as a JSON object, by kind (only the tags present)."""
    return {tag.kind: tag.to_json() for tag in sorted(tags, key=lambda t: t.kind)}


def tags_from_json(doc: Mapping[str, Any]) -> NodeTags:
    """Inverse of tags_to_json; raises ValueError (or KeyError/TypeError) on a malformed object
    or a kind no imported module defines."""
    unknown = sorted(set(doc) - set(_KINDS))
    if unknown:
        raise ValueError(f"unknown node tags {unknown}; known: {sorted(_KINDS)}")
    return NodeTags(*(_KINDS[kind].from_json(value) for kind, value in doc.items())) if doc else NO_TAGS


def tags_from_extra(extra: Mapping[str, Any]) -> NodeTags:
    """The tags of a node of a version-1 graph file, from its `extra` dict (each kind's
    from_extra: "fission", "part", "of", "path", "n", "label", "component", "role";
    "remat_of"; "swap_of"; "taso"; "fake_dtypes"; "rewritten_from")."""
    found = [tag for cls in _KINDS.values() if (tag := cls.from_extra(extra)) is not None]
    return NodeTags(*found) if found else NO_TAGS


def without_none(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` without its None values (what a tag's to_json leaves out)."""
    return {k: v for k, v in doc.items() if v is not None}


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
