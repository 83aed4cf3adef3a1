"""The tag of the nodes the TASO-style rewrites make (kind "taso"; peakcut.ir.tags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from peakcut.ir.tags import Tag, opt_int, opt_str, without_none


@dataclass(frozen=True, slots=True)
class TasoTag(Tag):
    """A node made by the TASO-style rule `rule`.

    A merged matmul (merge_matmuls) also says how it was merged: mode ("cols", "rows" or
    "sum"), the output sizes of the matmuls merged and their names (what split_matmul needs
    to un-merge it). A part of a split matmul (split_matmul) says which part it is and the
    name of the matmul split.
    """

    kind: ClassVar[str] = "taso"
    rule: str
    mode: str | None = None
    sizes: tuple[int, ...] = ()
    merged: tuple[str, ...] = ()
    part: int | None = None
    part_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        return without_none({
            "rule": self.rule, "mode": self.mode, "sizes": list(self.sizes) or None,
            "merged": list(self.merged) or None, "part": self.part, "part_of": self.part_of})

    @classmethod
    def from_json(cls, doc: Any) -> TasoTag:
        return cls(str(doc["rule"]), opt_str(doc.get("mode")), tuple(int(s) for s in doc.get("sizes", ())),
                   tuple(str(m) for m in doc.get("merged", ())), opt_int(doc.get("part")),
                   opt_str(doc.get("part_of")))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> TasoTag | None:
        if "taso" not in extra:
            return None
        t = extra["taso"]
        merge = t.get("rule") == "merge_matmuls"
        return cls(str(t["rule"]), opt_str(t.get("mode")), tuple(int(s) for s in t.get("sizes", ())),
                   tuple(str(m) for m in t.get("of", ())) if merge else (), opt_int(t.get("part")),
                   None if merge or "of" not in t else str(t["of"]))
