"""transformers causal LMs with their default config (use_cache=True) capture for training:
the trace turns the KV cache off (and says so in TraceLog.notes), the config is restored, and
an error whose real cause is a KV cache object says so."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import peakcut
from peakcut.capture.trace import TraceLog, trace_step
from peakcut.ir.serialize import graph_from_json, graph_to_json


def llama():
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))


def gpt2():
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))


def lm_loss(m, b):
    return m(input_ids=b[0], labels=b[0]).loss


@pytest.mark.parametrize("make", [llama, gpt2])
def test_default_config_captures_and_matches_eager(make):
    torch.manual_seed(0)
    model = make().eval()  # dropout off: eager and the step must draw the same numbers
    assert model.config.use_cache is True
    batch = (torch.randint(0, 64, (2, 8)),)
    g = peakcut.capture(model, batch, lm_loss, None)
    assert model.config.use_cache is True  # restored

    eager = copy.deepcopy(model)
    loss = lm_loss(eager, batch)
    loss.backward()
    mine = copy.deepcopy(model)
    got = peakcut.build(g)(mine, batch)
    torch.testing.assert_close(got, loss.detach())
    for (name, p), q in zip(eager.named_parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_trace_turns_the_cache_off_and_notes_it():
    model = llama()
    seen = []

    def fn(ids):
        seen.append(model.config.use_cache)
        return ids * 2

    log = TraceLog()
    trace_step(fn, (torch.randint(0, 64, (2, 8)),), model, log, torch.device("cpu"))
    assert seen == [False] and model.config.use_cache is True
    (note,) = log.notes
    assert "use_cache=True on LlamaForCausalLM's config" in note and "use_cache=False" in note
    assert log.kv_caches == []


def test_an_explicit_kv_cache_is_named_as_the_cause():
    torch.manual_seed(0)
    model = llama()
    batch = (torch.randint(0, 64, (2, 8)),)
    with pytest.raises(peakcut.CaptureError) as err:
        peakcut.capture(model, batch, lambda m, b: m(input_ids=b[0], labels=b[0], use_cache=True).loss, None)
    text = str(err.value)
    assert "KV cache (DynamicCache)" in text and "module 'model' returns" in text
    assert "use_cache=False" in text and "register it as a buffer" not in text
    assert model.config.use_cache is True


def test_capture_notes_reach_the_plan_report() -> None:
    model = llama()
    ids = torch.randint(0, 64, (2, 16))

    def loss_fn(m, b):
        return m(input_ids=b[0], labels=b[0]).loss

    plan = peakcut.optimize(model, (ids,), loss_fn, torch.optim.AdamW(model.parameters()), time_budget=10,
                            max_states=4)
    assert any("use_cache=False" in note for note in plan.report["capture_notes"])
    assert graph_from_json(graph_to_json(plan.graph)).signature.notes == plan.graph.signature.notes
