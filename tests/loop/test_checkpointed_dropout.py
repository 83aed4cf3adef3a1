"""Activation checkpointing around dropout gives eager's numbers, over 10 AdamW steps.

torch.utils.checkpoint (both modes) stashes the generator's state before a checkpointed
forward and restores it for the recompute in the backward, so the recompute draws the
forward's dropout masks. The captured step must do the same (capture.rng): fresh masks in
the recompute give other gradients. Checked for a plain model in both modes and for a
transformers causal LM with a PEFT LoRA adapter (lora_dropout > 0) after
gradient_checkpointing_enable(), with the user's torch.optim.AdamW: the loss, every
gradient, parameter and optimizer state tensor after every step, for the untransformed step
and for a plan that splits (fission), recomputes (remat) and swaps.

Tolerance: the untransformed step runs eager's kernels in eager's order and matches to the
bit; a plan that splits a reduction rounds differently, by tests.tolerance for float32
over the longest reduction of the step, carried through the steps.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.graph import Graph
from peakcut.ir.ops import RNG_STATE_OP, SET_RNG_STATE_OP
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import DeriveError
from tests.tolerance import tolerance

STEPS = 10
LossFn = Callable[[Any, Any], torch.Tensor]


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(d, 2 * d), nn.Dropout(0.3), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class Checkpointed(nn.Module):
    """An input layer, two blocks of Linear-ReLU-Dropout-Linear under torch.utils.checkpoint, a head."""

    def __init__(self, reentrant: bool, d: int = 16) -> None:
        super().__init__()
        self.inp, self.head, self.reentrant = nn.Linear(d, d), nn.Linear(d, 4), reentrant
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def plain_case(reentrant: bool) -> tuple[nn.Module, Callable[[int], tuple], LossFn]:
    torch.manual_seed(0)
    model = Checkpointed(reentrant)

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + k)
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)

    def loss_fn(m: Any, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]), b[1])

    return model, batch, loss_fn


def lora_case(reentrant: bool, autocast: bool = False) -> tuple[nn.Module, Callable[[int], tuple], LossFn]:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), lora)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.config.use_cache = False
    model.train()

    def batch(k: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(100 + k)),)

    def loss_fn(m: Any, b: tuple[torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return m(input_ids=b[0], labels=b[0]).loss

    return model, batch, loss_fn


def transformed(g: Graph, kinds: tuple[str, ...]) -> tuple[Graph, list[int], list[str]]:
    """The searched plan after one move of each kind in `kinds` (the first of its moves that
    builds), from the search's root; the moves' descriptions."""
    found = optimize_graph(g, time_budget=0.3, max_states=1, device="h200", fission_dims="batch")
    deriver, state = found.deriver, found.result.root
    rng = random.Random(0)
    applied: list[str] = []
    for kind in kinds:
        for move in children(state, deriver, MoveSettings(hotspots_only=False), rng):
            if move.kind != kind:
                continue
            try:
                child = move.build()
                state = deriver.resolve(child) if child.pending is not None else child
            except DeriveError:
                continue
            applied.append(move.description)
            break
    if state.compact:
        state = deriver.exact(state)
    return state.program, state.order, applied


def compare(ours: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def run_against_eager(case: Callable[[bool], tuple], reentrant: bool, kinds: tuple[str, ...]) -> list[str]:
    """10 steps of the plan (after moves of `kinds`) beside the eager loop; returns the moves."""
    model, batch, loss_fn = case(reentrant)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, foreach=False)
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2, foreach=False)
    g = peakcut.capture(model, batch(0), loss_fn, opt, keep_grads=True)
    rng_ops = [n.op for n in g.nodes.values() if n.op in (RNG_STATE_OP, SET_RNG_STATE_OP)]
    assert RNG_STATE_OP in rng_ops and SET_RNG_STATE_OP in rng_ops   # the recompute replays the state
    program, order, applied = transformed(g, kinds) if kinds else (g, list(g.order), [])
    assert len(applied) == len(kinds), f"moves applied: {applied}"
    step = Step(program, order, optimizer=opt)
    largest = max(t.numel for t in g.tensors.values())
    for k in range(1, STEPS + 1):
        b = batch(k)
        torch.manual_seed(k)
        ref_loss = loss_fn(ref, b)
        ref_loss.backward()
        ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters() if p.grad is not None}
        ref_opt.step()
        ref_opt.zero_grad()
        torch.manual_seed(k)
        loss = step(model, b)
        tol = 0.0 if not kinds else tolerance(torch.float32, largest, k)
        compare(loss.detach(), ref_loss.detach(), tol, f"step {k} loss")
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            compare(grad, ref_grads[name], tol, f"step {k} gradient {name}")
        opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            compare(p.detach(), q.detach(), tol, f"step {k} parameter {name}")
        ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        assert ours.keys() == theirs.keys()
        for i, slots in theirs.items():
            for slot, value in slots.items():
                compare(ours[i][slot], value, tol, f"step {k} optimizer state {i}.{slot}")
    return applied


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_dropout_blocks_step_as_eager(reentrant: bool) -> None:
    run_against_eager(plain_case, reentrant, ())


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_plan_that_splits_recomputes_and_swaps_checkpointed_dropout_steps_as_eager(reentrant: bool) -> None:
    applied = run_against_eager(plain_case, reentrant, ("fission", "remat", "swap"))
    assert applied[0].startswith("fission") and applied[1].startswith("remat") and "swap" in applied[2]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_lora_with_gradient_checkpointing_steps_as_eager(reentrant: bool) -> None:
    run_against_eager(lora_case, reentrant, ())


def test_lora_with_gradient_checkpointing_under_bf16_autocast_steps_as_eager() -> None:
    run_against_eager(lambda reentrant: lora_case(reentrant, autocast=True), False, ())


def test_an_optimized_lora_plan_steps_as_eager() -> None:
    """peakcut.optimize's own search, within 1.5x of eager's time on the H200 profile."""
    model, batch, loss_fn = lora_case(False)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    plan = peakcut.optimize(model, batch(0), loss_fn, opt, latency_limit=1.5, time_budget=15, max_states=40,
                            device="h200")
    largest = max(t.numel for t in plan.graph.tensors.values())
    for k in range(1, STEPS + 1):
        torch.manual_seed(k)
        ref_loss = loss_fn(ref, batch(k))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.manual_seed(k)
        loss = plan.step(batch(k))
        tol = tolerance(torch.float32, largest, k)
        compare(loss.detach(), ref_loss.detach(), tol, f"step {k} loss")
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            compare(p.detach(), q.detach(), tol, f"step {k} parameter {name}")
        ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        for i, slots in theirs.items():
            for slot, value in slots.items():
                compare(ours[i][slot], value, tol, f"step {k} optimizer state {i}.{slot}")


def test_a_searched_lora_plan_with_gradient_checkpointing_steps_as_eager() -> None:
    run_against_eager(lora_case, False, ("fission", "remat", "swap"))


def test_the_recompute_is_captured_with_the_forwards_generator_state() -> None:
    """Each checkpointed block's recompute sets the generator to the state saved before its
    forward and back afterwards: the generated program calls torch.set_rng_state."""
    model, batch, loss_fn = plain_case(False)
    g = peakcut.capture(model, batch(0), loss_fn, "adamw")
    source = Step(g).source
    assert source.count("torch.get_rng_state()") == 4        # two forwards, two recomputes (fork_rng)
    assert source.count("torch.set_rng_state(") == 4         # to the saved state, and back
