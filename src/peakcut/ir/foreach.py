"""The foreach tag: a node that is one tensor's share of an op torch.optim runs over a list.

torch.optim's foreach implementation runs each op of the update over every tensor of a
device/dtype group at once (`torch._foreach_lerp_(exp_avgs, grads, w)`, ...), and its fused
one runs one kernel over the lists (`torch._fused_adamw_`). Capture records such an op as one
node per tensor, in the order the list op runs them (every tensor of the op before the next
op), so liveness counts the list-wide temporaries the list op holds. Each of those nodes
carries a ForeachTag naming the run it belongs to: code generation writes a run of
consecutive nodes of one run back as one list call (codegen.foreach_code), and the analytic
cost model charges the run's launch once (cost.analytic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from peakcut.ir.tags import Tag


@dataclass(frozen=True, slots=True)
class ForeachTag(Tag):
    """Tensor `index` of the `size` tensors of list op `op` ('_foreach_lerp_',
    '_fused_adamw_', ...), run number `run` of the captured step (unique per list call)."""

    kind: ClassVar[str] = "foreach"
    run: int
    op: str
    size: int
    index: int

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "op": self.op, "size": self.size, "index": self.index}

    @classmethod
    def from_json(cls, doc: Any) -> ForeachTag:
        size, index = int(doc["size"]), int(doc["index"])
        if not 0 <= index < size:
            raise ValueError(f"foreach tag index {index} outside a run of {size}")
        return cls(int(doc["run"]), str(doc["op"]), size, index)
