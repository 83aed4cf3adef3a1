"""The hooks through which code other than an ordinary ATen call reaches the generated step.

A CodeHook knows one kind of node (found by its op or its tags): the identifiers its code
uses, the fission regions it cannot write inside a loop, and, for one program, the NodeCode
that writes those nodes. codegen.builtin_code lists the hooks of the nodes peakcut's own
transformations add; a caller hands in more (generate_source(..., extra=...), Step(...,
code=...)), so new code needs no edit of codegen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node

LoopRefusal = Callable[[Sequence[int]], str | None]
"""Why a fission region with these nodes cannot be emitted as a loop (None: it can)."""


class Names(Protocol):
    """What node code needs from the source generator's naming (codegen.source)."""

    by_tensor: dict[int, str]

    def fresh(self, text: str) -> str: ...


class NodeCode:
    """What one hook writes into one generated step. Every hook defaults to nothing extra:
    a subclass writes only the ones it needs."""

    def signature_extra(self) -> str:
        """Keyword parameters the step takes for this code (e.g. ', host'), or ''."""
        return ""

    def prologue(self) -> list[str]:
        """Lines at the top of the step's body."""
        return []

    def keeps(self, tensor: int) -> bool:
        """True when the step must not `del` this tensor at its last use (this code does)."""
        return False

    def before(self, nid: int, pad: str) -> list[str]:
        """Lines right before node nid's own lines (pad: the indentation at that point)."""
        return []

    def emit(self, node: Node) -> list[str] | None:
        """The node's own lines when this code writes them, else None (an ordinary ATen call)."""
        return None

    def epilogue(self) -> list[str]:
        """Lines at the end of the step's body, before it returns."""
        return []


class CodeHook:
    """The code of one kind of node. Defaults: no reserved names, no refusal, no code."""

    reserved_names: tuple[str, ...] = ()
    """Identifiers this hook's code uses: never given to a tensor of any program."""

    def loop_refusal(self, g: Graph) -> LoopRefusal | None:
        """Why fission regions holding this hook's nodes in g cannot be loops (None: no refusal)."""
        return None

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        """The code of this hook's nodes in program (g, order); None when g has none."""
        return None


def combined_refusal(hooks: Sequence[CodeHook], g: Graph) -> LoopRefusal | None:
    """Why a fission region of g cannot be a loop, from every hook (None: no hook refuses any)."""
    refusals = [r for hook in hooks if (r := hook.loop_refusal(g)) is not None]
    if not refusals:
        return None
    if len(refusals) == 1:
        return refusals[0]

    def refuse(nodes: Sequence[int]) -> str | None:
        return next((why for r in refusals if (why := r(nodes)) is not None), None)

    return refuse
