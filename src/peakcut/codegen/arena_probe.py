"""Does an op's out overload write into the tensors it is given? A probe on the device, per call shape.

    refused = probe_out_variants(g, {node: variant, ...}, device="cpu")
    refused[node]      # why its out overload is no placement (nodes absent: it is one)

An out overload is a placement when it writes its results into the given tensors without
making them elsewhere first. Some are not: PyTorch generates out overloads for many ops that
run the functional kernel and copy its result into `out` (convolution's, for one), and a
kernel may resize or re-allocate an out tensor whose layout it dislikes. The probe runs each
distinct call (op, argument shapes, strides, dtypes and values other than tensors) once
functionally and once through the out overload on tensors of the node's shapes on the
device (inputs as the measured cost model makes them, peakcut.ir.real_tensors: floating
ones a block of random values repeated, from a private generator, integer and boolean ones
zero; outs uninitialized; ops that draw random numbers draw from a fork of the RNG that
leaves the caller's stream as it was), and refuses the out overload
when the call fails, when an out tensor's data pointer, shape or strides change, or when the
out call allocates as much as a result (CPU: an allocation of a result's bytes among the
allocator's events, torch.profiler; CUDA: the allocator's peak not below the functional
call's less the results' bytes). A device other than "cpu" or "cuda" is not probed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from peakcut.codegen.out_variants import OutVariant, overload_of
from peakcut.ir.graph import Graph
from peakcut.ir.node import Hyper, Node, TensorRef
from peakcut.ir.real_tensors import INPUT_SEED, real_tensor
from peakcut.memory.workspace.profiler import allocator_profile

COPIES = "its out overload computes elsewhere and copies into the given tensor (probe)"


def _arguments(node: Node, g: Graph, device: torch.device, generator: torch.Generator
               ) -> tuple[list[Any], dict[str, Any]]:
    def real(v: Any) -> Any:
        if isinstance(v, TensorRef):
            return real_tensor(g.tensors[v.id], device, generator)
        if isinstance(v, Hyper):
            return float(v)
        if isinstance(v, (list, tuple)):
            return type(v)(real(x) for x in v)
        return v

    return [real(a) for a in node.args], {k: real(v) for k, v in node.kwargs.items()}


def call_key(node: Node, g: Graph) -> tuple[Any, ...]:
    """What a probe of node's call depends on: its op, its tensors' layouts, its other values."""
    def key(v: Any) -> Any:
        if isinstance(v, TensorRef):
            m = g.tensors[v.id]
            return ("T", m.shape, m.stride, m.dtype, m.storage_offset)
        if isinstance(v, (list, tuple)):
            return tuple(key(x) for x in v)
        return repr(v)

    outs = tuple(key(TensorRef(t)) if t is not None else None for t in node.outputs)
    return (node.op, key(tuple(node.args)), tuple((k, key(v)) for k, v in node.kwargs.items()), outs)


def probe_out_variants(g: Graph, variants: Mapping[int, OutVariant], device: str,
                       known: dict[tuple[Any, ...], str | None] | None = None) -> dict[int, str]:
    """The nodes of `variants` whose out overload is no placement on `device`, with why (module
    doc). known: verdicts by call_key from earlier probes on the same device, used and added to."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        return {}
    known = {} if known is None else known
    groups: dict[tuple[Any, ...], list[int]] = {}
    for nid in (n for n, v in variants.items() if not v.method):     # in-place forms need no probe
        groups.setdefault(call_key(g.nodes[nid], g), []).append(nid)
    new = [key for key in groups if key not in known]
    calls = [(groups[key][0], variants[groups[key][0]]) for key in new]
    # the probes' random inputs draw from a fork of the RNG: the caller's stream stays where it was
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        verdicts = _probe_all(g, calls, dev)
    known.update(zip(new, verdicts, strict=True))
    refused: dict[int, str] = {}
    for key, nodes in groups.items():
        why = known[key]
        if why is not None:
            refused.update(dict.fromkeys(nodes, why))
    return refused


def _probe_all(g: Graph, calls: Sequence[tuple[int, OutVariant]], dev: torch.device) -> list[str | None]:
    """One verdict per call (None: a placement)."""
    if not calls:
        return []
    if dev.type == "cuda":
        return [_probe_cuda(g, nid, variant, dev) for nid, variant in calls]
    verdicts: list[str | None] = []
    with allocator_profile() as prof:
        ranges: list[str] = []
        for i, (nid, variant) in enumerate(calls):
            verdicts.append(_probe(g, nid, variant, dev, _marked(f"peakcut_probe_{i}_", ranges)))
    sizes = _sizes_by_range(prof, ranges)
    for i, (nid, _) in enumerate(calls):
        if verdicts[i] is not None:
            continue
        result_bytes = {g.tensors[t].numel * g.tensors[t].itemsize for t in g.nodes[nid].output_ids()}
        functional, out = sizes.get(f"peakcut_probe_{i}_fn", []), sizes.get(f"peakcut_probe_{i}_out", [])
        if any(n in result_bytes for n in out if n > 0) or (result_bytes - {0} and _peak(out) >= _peak(functional)):
            verdicts[i] = COPIES
    return verdicts


Runner = Callable[[str, Callable[[], Any]], None]
"""Runs one labelled call ("fn" or "out") of a probe, recording what it allocates."""


def _marked(prefix: str, ranges: list[str]) -> Runner:
    def run(label: str, fn: Callable[[], Any]) -> None:
        name = prefix + label
        ranges.append(name)
        with torch.profiler.record_function(name):
            fn()

    return run


def _probe_cuda(g: Graph, nid: int, variant: OutVariant, dev: torch.device) -> str | None:
    """The probe on CUDA: the out call's allocator peak must be the functional call's less the
    results' bytes (up to a few 512-byte blocks)."""
    peaks: dict[str, int] = {}

    def run(label: str, fn: Callable[[], Any]) -> None:
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        peaks[label] = int(torch.cuda.max_memory_allocated(dev)) - before

    why = _probe(g, nid, variant, dev, run)
    results = sum(g.tensors[t].numel * g.tensors[t].itemsize for t in g.nodes[nid].output_ids())
    if why is None and results and peaks["out"] + results > peaks["fn"] + 512 * 4:
        return COPIES
    return why


def _probe(g: Graph, nid: int, variant: OutVariant, dev: torch.device, run: Runner) -> str | None:
    node = g.nodes[nid]
    functional, out_op = overload_of(node.op), overload_of(variant.op)
    if functional is None or out_op is None:
        return f"no overload {node.op if functional is None else variant.op} in this torch"
    metas = [g.tensors[t] for t in node.output_ids()]
    try:
        generator = torch.Generator(device=dev)
        generator.manual_seed(INPUT_SEED)
        args, kwargs = _arguments(node, g, dev, generator)
        with torch.no_grad():
            run("fn", lambda: functional(*args, **kwargs))
            given = [torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype, device=dev) for m in metas]
            before = [(t.data_ptr(), t.shape, t.stride()) for t in given]
            run("out", lambda: out_op(*args, **kwargs, **dict(zip(variant.names, given, strict=True))))
    except Exception as e:  # noqa: BLE001 - any failure of the probe refuses the placement
        return f"the probe of its out overload failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if [(t.data_ptr(), t.shape, t.stride()) for t in given] != before:
        return "its out overload re-allocates or resizes the given tensor (probe)"
    return None


def _sizes_by_range(prof: Any, ranges: Sequence[str]) -> dict[str, list[int]]:
    """Range name -> the signed sizes of the CPU allocator's events inside it, in time order."""
    events = list(prof.profiler.kineto_results.events())
    spans = {e.name(): (e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() in set(ranges)}
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    times = [at for at, _ in memory]
    return {name: [n for _, n in memory[bisect.bisect_left(times, lo):bisect.bisect_right(times, hi)]]
            for name, (lo, hi) in spans.items()}


def _peak(sizes: Sequence[int]) -> int:
    live = peak = 0
    for n in sizes:
        live += n
        peak = max(peak, live)
    return peak
