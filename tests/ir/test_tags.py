"""Typed node tags: an open mapping of kinds, each written to and read from the graph JSON (and
read from the `extra` dicts of version-1 files, which saved plans hold); a kind is registered
once, by the module that defines it."""

from __future__ import annotations

import json

import pytest

import peakcut
from peakcut.capture.convert import FakeDtypesTag
from peakcut.ir import GraphError
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.ir.tags import (
    NO_TAGS,
    FissionTag,
    HostTag,
    NodeTags,
    RematTag,
    SwapTag,
    Tag,
    tags_from_extra,
    tags_from_json,
    tags_to_json,
)
from peakcut.rules import RULES
from peakcut.transform.rewrite import RewrittenFromTag
from peakcut.transform.taso.tag import TasoTag
from tests.conftest import cnn_loss

EXAMPLES = {
    "copy": NodeTags(FissionTag(3, "part", ((1, 0), (3, 1)), 1, 2, 17, "d0", 4)),
    "alloc": NodeTags(FissionTag(3, "alloc", ((1, 0),))),
    "slice": NodeTags(FissionTag(3, "slice", ((3, 1),), 1, 2)),
    "final merge": NodeTags(FissionTag(3, "merge", (), n=4)),
    "remat": NodeTags(RematTag(12)),
    "swap": NodeTags(SwapTag(40)),
    "merged": NodeTags(TasoTag("merge_matmuls", mode="cols", sizes=(64, 64),
                               merged=("addmm", "addmm_1"))),
    "split part": NodeTags(TasoTag("split_matmul", part=1, part_of="mm_3")),
    "rewrite": NodeTags(TasoTag("drop_identity")),
    "capture": NodeTags(FakeDtypesTag(("bfloat16", None)), RewrittenFromTag("ones_like")),
    "copy of a merged matmul": NodeTags(FissionTag(0, "part", ((0, 0),), 0, 2, 5, "d1", 0),
                                        TasoTag("merge_matmuls", mode="rows", sizes=(8, 8),
                                                merged=("mm", "mm_1"))),
}

# the same tags as version-1 `extra` dicts
EXTRAS = {
    "copy": {"fission": 3, "part": 1, "of": 17, "path": [[1, 0], [3, 1]], "n": 2, "label": "d0",
             "component": 4},
    "alloc": {"fission": 3, "role": "alloc", "path": [[1, 0]]},
    "slice": {"fission": 3, "role": "slice", "part": 1, "path": [[3, 1]], "n": 2},
    "final merge": {"fission": 3, "role": "merge", "path": [], "n": 4},
    "remat": {"remat_of": 12},
    "swap": {"swap_of": 40},
    "merged": {"taso": {"rule": "merge_matmuls", "mode": "cols", "sizes": [64, 64],
                        "of": ["addmm", "addmm_1"]}},
    "split part": {"taso": {"rule": "split_matmul", "part": 1, "of": "mm_3"}},
    "rewrite": {"taso": {"rule": "drop_identity"}},
    "capture": {"fake_dtypes": ["bfloat16", None], "rewritten_from": "ones_like"},
    "copy of a merged matmul": {"taso": {"rule": "merge_matmuls", "mode": "rows", "sizes": [8, 8],
                                         "of": ["mm", "mm_1"]},
                                "fission": 0, "part": 0, "of": 5, "path": [[0, 0]], "n": 2,
                                "label": "d1", "component": 0},
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_tags_round_trip_through_json(name):
    tags = EXAMPLES[name]
    assert tags_from_json(json.loads(json.dumps(tags_to_json(tags)))) == tags


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_version_1_extras_give_the_same_tags(name):
    assert tags_from_extra(EXTRAS[name]) == EXAMPLES[name]


def test_no_tags_write_nothing():
    assert tags_to_json(NO_TAGS) == {} and tags_from_json({}) == NO_TAGS


def test_version_2_files_keep_their_json():
    """What version-2 files hold for each kind (written before kinds were open) reads the same."""
    assert tags_from_json({"fission": {"region": 3, "role": "alloc", "path": [[1, 0]]},
                           "taso": {"rule": "split_matmul", "part": 1, "part_of": "mm_3"},
                           "fake_dtypes": ["bfloat16", None], "rewritten_from": "ones_like",
                           "host": {"param": 4, "role": "store"}}) == NodeTags(
        FissionTag(3, "alloc", ((1, 0),)), TasoTag("split_matmul", part=1, part_of="mm_3"),
        FakeDtypesTag(("bfloat16", None)), RewrittenFromTag("ones_like"), HostTag(4, "store"))


def test_node_tags_are_an_open_mapping_by_kind():
    fission = FissionTag(3, "slice", ((3, 1),), 1, 2)
    tags = NodeTags(RematTag(12))
    both = tags.with_tag(fission)
    assert both.get(FissionTag) == fission and both.get(RematTag) == RematTag(12) and both.get(SwapTag) is None
    assert both.with_tag(RematTag(13)).get(RematTag) == RematTag(13) and len(both) == 2
    assert both.without(RematTag) == NodeTags(fission) and tags.without(SwapTag) is tags
    assert NodeTags(HostTag(1, "update")).on_host and not NodeTags(HostTag(1, "store")).on_host
    assert NO_TAGS.with_tag(HostTag(1, "update")).on_host and not both.on_host
    with pytest.raises(ValueError, match="two node tags of one kind"):
        NodeTags(RematTag(1), RematTag(2))


def test_a_kind_is_registered_once():
    with pytest.raises(TypeError, match="'remat' is"):
        class Another(Tag):      # noqa: F841 (defining it is the test)
            kind = "remat"

            def to_json(self) -> None:
                return None

            @classmethod
            def from_json(cls, doc: object) -> Another:
                return cls()


def test_unknown_tags_or_roles_are_rejected():
    with pytest.raises(ValueError, match="unknown node tags"):
        tags_from_json({"remat_of": 3})
    with pytest.raises(ValueError, match="unknown fission role"):
        tags_from_json({"fission": {"region": 0, "role": "bogus"}})


@pytest.fixture
def rewritten(small_cnn):
    """A captured step with a swap and a recompute applied."""
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    order = list(g.order)
    for kind in ("swap", "remat"):
        (c,) = RULES.hotspot_candidates(g, order, limit=1, kinds=(kind,))[:1]
        rw = c.apply(g, order)
        g, order = rw.graph, rw.order
    return g


def test_a_graph_keeps_its_tags_through_json(rewritten):
    g = rewritten
    assert any(n.tags.get(SwapTag) for n in g.nodes.values()) and any(n.tags.get(RematTag) for n in g.nodes.values())
    again = graph_from_json(graph_to_json(g))
    assert {nid: n.tags for nid, n in again.nodes.items()} == {nid: n.tags for nid, n in g.nodes.items()}


def test_a_version_1_file_loads_with_its_tags(rewritten):
    """A version-1 file (what plans saved before typed tags hold) has `extra` dicts."""
    g = rewritten
    doc = json.loads(graph_to_json(g))
    doc["version"] = 1
    for node in doc["nodes"]:
        tags = g.nodes[node["id"]].tags
        node.pop("tags", None)
        if (remat := tags.get(RematTag)) is not None:
            node["extra"] = {"remat_of": remat.of}
        elif (swap := tags.get(SwapTag)) is not None:
            node["extra"] = {"swap_of": swap.of}
    again = graph_from_json(json.dumps(doc))
    assert {nid: n.tags for nid, n in again.nodes.items()} == {nid: n.tags for nid, n in g.nodes.items()}
    doc["version"] = 3
    with pytest.raises(GraphError, match="reads versions 1, 2"):
        graph_from_json(json.dumps(doc))
