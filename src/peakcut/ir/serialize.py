"""Versioned JSON (de)serialization of a Graph.

Format: {"format": "peakcut.graph", "version": 2, ...}. Loading checks the
format tag and version, decodes every field strictly and runs check_graph(),
so a corrupt or foreign file is rejected with a message that says why.

Version 2 writes a node's typed tags (peakcut.ir.tags) as "tags"; version 1 (what plans
saved before it hold) wrote them as an "extra" dict of string keys, still read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import torch

from peakcut.ir import foreach  # noqa: F401  (registers the foreach tag kind, read back from JSON)
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph, GraphError, StepSignature
from peakcut.ir.node import Hyper, Node, Phase, TensorRef
from peakcut.ir.tags import NO_TAGS, NodeTags, tags_from_extra, tags_from_json, tags_to_json
from peakcut.ir.tensor import Role, TensorMeta, dtype_from_name, dtype_name

FORMAT = "peakcut.graph"
VERSION = 2
READS = (1, 2)   # versions graph_from_json reads


def _enc(v: Any) -> Any:
    if isinstance(v, TensorRef):
        return {"t": v.id}
    if isinstance(v, Hyper):
        return {"hyper": [v.name, _enc(float(v))]}
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, tuple):
        return {"tuple": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    raise TypeError(f"cannot serialize argument of type {type(v).__name__}: {v!r}")


def _dec(v: Any) -> Any:
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) != 1:
        raise GraphError(f"bad encoded argument {v!r}")
    (key, x), = v.items()
    if key == "t":
        return TensorRef(int(x))
    if key == "float":
        return float(x)
    if key == "hyper":
        return Hyper(str(x[0]), float(_dec(x[1])))
    if key == "tuple":
        return tuple(_dec(y) for y in x)
    if key == "dtype":
        return dtype_from_name(x)
    if key == "device":
        return torch.device(x)
    if key == "layout":
        return getattr(torch, x)
    if key == "memory_format":
        return getattr(torch, x)
    raise GraphError(f"unknown encoded argument kind {key!r}")


def graph_to_json(g: Graph) -> str:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "device": g.device,
        "signature": asdict(g.signature),
        "storages": [[s, b] for s, b in g.storages.items()],
        "tensors": [
            [t.id, list(t.shape), list(t.stride), t.dtype, t.storage, t.storage_offset, t.role.value, t.name]
            for t in g.tensors.values()
        ],
        "nodes": [
            {
                "id": n.id, "op": n.op, "args": _enc(n.args), "kwargs": {k: _enc(x) for k, x in n.kwargs.items()},
                "outputs": list(n.outputs), "multi": n.multi_output, "module": n.module,
                "phase": n.phase.value, "name": n.name,
                **({"tags": tags_to_json(n.tags)} if n.tags != NO_TAGS else {}),
            }
            for n in g.nodes.values()
        ],
        "inputs": g.inputs, "input_names": g.input_names,
        "outputs": g.outputs, "output_names": g.output_names,
        "order": g.order,
        "control": [[k, list(v)] for k, v in g.control.items()],
    }
    return json.dumps(doc, separators=(",", ":"))


def graph_from_json(text: str) -> Graph:
    """Parse and validate; raises GraphError with the reason on any problem."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"not a peakcut graph: invalid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphError(f"not a peakcut graph: missing format tag {FORMAT!r}")
    version = doc.get("version")
    if version not in READS:
        raise GraphError(
            f"peakcut graph version {version!r} is not supported by this peakcut (reads versions "
            f"{', '.join(map(str, READS))}); capture the model again with this version"
        )
    try:
        g = Graph(
            tensors={
                int(i): TensorMeta(int(i), tuple(shape), tuple(stride), str(dt), int(st), int(off), Role(role), str(name))
                for i, shape, stride, dt, st, off, role, name in doc["tensors"]
            },
            nodes={
                int(n["id"]): Node(
                    id=int(n["id"]), op=str(n["op"]), args=tuple(_dec(n["args"])),
                    kwargs={k: _dec(x) for k, x in n["kwargs"].items()},
                    outputs=tuple(None if o is None else int(o) for o in n["outputs"]),
                    multi_output=bool(n["multi"]), module=str(n["module"]), phase=Phase(n["phase"]),
                    name=str(n["name"]), tags=_node_tags(n, version),
                )
                for n in doc["nodes"]
            },
            inputs=[int(x) for x in doc["inputs"]], input_names=[str(x) for x in doc["input_names"]],
            outputs=[int(x) for x in doc["outputs"]], output_names=[str(x) for x in doc["output_names"]],
            storages={int(s): int(b) for s, b in doc["storages"]},
            order=[int(x) for x in doc["order"]],
            control={int(k): tuple(int(x) for x in v) for k, v in doc["control"]},
            device=str(doc["device"]),
            signature=StepSignature(**{**doc["signature"], "notes": tuple(doc["signature"].get("notes", ())),
                                       "requires_grad": tuple(doc["signature"].get("requires_grad", ()))}),
        )
    except GraphError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise GraphError(f"corrupt peakcut graph: {type(e).__name__}: {e}") from None
    check_graph(g)
    return g


def _node_tags(node: dict[str, Any], version: int) -> NodeTags:
    if version == 1:
        return tags_from_extra(node.get("extra", {}))
    return tags_from_json(node.get("tags", {}))
