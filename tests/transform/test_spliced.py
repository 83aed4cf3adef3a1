"""rewrite.spliced, which copies the order in slices between the places it inserts at, against
the element-by-element walk it replaced (the definition: new nodes before the first of their
`before` anchors, after the last of their `after` anchors, `removed` left out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from peakcut.transform.rewrite import spliced


def walked(sequence: Sequence[int], removed: Sequence[int], after: Mapping[int, Sequence[int]],
           before: Mapping[int, Sequence[int]]) -> list[int]:
    pos = {nid: i for i, nid in enumerate(sequence)}
    ahead: dict[int, list[int]] = {}
    behind: dict[int, list[int]] = {}
    for new, anchors in before.items():
        ahead.setdefault(min((pos[q] for q in anchors if q in pos), default=len(sequence)), []).append(new)
    for new, anchors in after.items():
        behind.setdefault(max((pos[q] for q in anchors if q in pos), default=-1), []).append(new)
    out = list(reversed(behind.get(-1, ())))
    for i, nid in enumerate(sequence):
        out.extend(ahead.get(i, ()))
        if nid not in set(removed):
            out.append(nid)
        out.extend(reversed(behind.get(i, ())))
    out.extend(ahead.get(len(sequence), ()))
    return out


anchors = st.lists(st.integers(0, 35), max_size=3)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=20), st.lists(st.integers(0, 35), max_size=5),
       st.dictionaries(st.integers(100, 120), anchors, max_size=5),
       st.dictionaries(st.integers(200, 220), anchors, max_size=5))
def test_spliced_is_the_walk(sequence: list[int], removed: list[int], after: dict[int, list[int]],
                             before: dict[int, list[int]]) -> None:
    assert spliced(sequence, removed, after, before) == walked(sequence, removed, after, before)
