"""The peers a user picks when a step does not fit, run on the same model as eager and the
plan: gradient accumulation at k = 2 and 4 (bench.peers.accumulate: the same effective
batch as k micro-batches, one update) and selective activation checkpointing as
torchtitan's default does it (bench.peers.tools.apply_selective_checkpointing); and the best
of them under each limit.

Accumulation gives eager's numbers where the loss is a mean over equally sized micro-batches;
`exactness` says where it does not (BatchNorm statistics, BERT's masked-LM mean).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.peers.accumulate import BATCHNORM_NOTE, accumulation_step, has_batchnorm
from bench.peers.tools import apply_selective_checkpointing

KS: tuple[int, ...] = (2, 4)
SAC = "selective checkpointing"
INEXACT_LOSS: dict[str, str] = {"bert-base": "masked-LM loss: a mean over each micro-batch's masked tokens"}


def names() -> list[str]:
    return [accumulation_name(k) for k in KS] + [SAC]


def accumulation_name(k: int) -> str:
    return f"accumulation k={k}"


def exactness(peer: str, workload: str, model: torch.nn.Module) -> str:
    """Why `peer` is not expected to give eager's numbers on `workload` ("" where it is)."""
    if not peer.startswith("accumulation"):
        return ""
    if has_batchnorm(model):
        return BATCHNORM_NOTE
    return INEXACT_LOSS.get(workload, "")


def step_of(peer: str, model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any],
            opt: torch.optim.Optimizer) -> Callable[[], torch.Tensor]:
    """The user's training step as `peer` runs it (loss, backward(s), update, grads to None)."""
    if peer.startswith("accumulation"):
        k = int(peer.rpartition("=")[2])
        return lambda: accumulation_step(model, batch, loss_fn, opt, k)
    params = list(model.parameters())

    def step() -> torch.Tensor:
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        for p in params:
            p.grad = None
        return loss.detach()

    return step


@contextlib.contextmanager
def applied(peer: str, workload: str, model: torch.nn.Module) -> Iterator[str]:
    """`model` set up for `peer` while the block runs (selective checkpointing wraps its blocks'
    forwards; undone after); yields how."""
    if peer != SAC:
        yield f"{peer.rpartition('=')[2]} micro-batches of the batch, one AdamW step"
        return
    before = {id(m) for m in model.modules() if "forward" in vars(m)}
    try:
        yield apply_selective_checkpointing(workload, model)
    finally:
        for m in model.modules():
            if "forward" in vars(m) and id(m) not in before:
                del m.forward


def best(peers: dict[str, dict[str, Any]], limit: str, value: float) -> dict[str, Any]:
    """The best peer under one limit, from each peer's measured ratios to eager: at
    latency <= value the least allocated peak, at memory <= value the fastest; where none meets
    the limit, the closest (least time over, least memory over) with meets False."""
    ran = {n: p["ratios"] for n, p in peers.items() if p.get("ratios")}
    if not ran:
        return {"name": None, "why": "no peer measured against eager"}
    axis, other = ("time", "allocated") if limit == "latency" else ("allocated", "time")
    meeting = {n: r for n, r in ran.items() if r[axis] <= value}
    if meeting:
        name = min(meeting, key=lambda n: (meeting[n][other], n))
        return {"name": name, "meets": True, **ran[name]}
    name = min(ran, key=lambda n: (ran[n][axis], n))
    return {"name": name, "meets": False, **ran[name],
            "why": f"no peer at {axis} <= {value:g} of eager; closest {name} at x{ran[name][axis]:.3f}"}


def beats(plan: dict[str, float] | None, peer: dict[str, Any], limit: str, value: float) -> bool | None:
    """Whether the plan's measured ratios beat the best peer's under the limit: meeting it with
    less memory (latency) or less time (memory); None where either was not measured."""
    if not plan or peer.get("name") is None:
        return None
    axis, other = ("time", "allocated") if limit == "latency" else ("allocated", "time")
    if plan[axis] > value:
        return False
    return not peer.get("meets") or plan[other] < peer[other]
