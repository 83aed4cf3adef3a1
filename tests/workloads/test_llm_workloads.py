"""The full-size LLM workloads (issue 17): Llama-2-7B and GPT-2-XL.

Tiny sizes: 3 steps of the generated program match eager PyTorch with SGD and AdamW (the check
of tests/runtime/test_workloads_equivalence.py). Paper sizes build on meta with the published
parameter counts; GPT-2-XL deepens to 96 layers for scale tests.
"""

from __future__ import annotations

import pytest
import torch

from peakcut.workloads import (
    ALL_WORKLOAD_NAMES,
    LLM_WORKLOAD_NAMES,
    WORKLOAD_NAMES,
    get_workload,
    list_workloads,
)
from peakcut.workloads.base import deepened_gpt2_xl
from peakcut.workloads.llm import gpt2_xl_config, llama2_7b_config
from tests.runtime.test_workloads_equivalence import OPTIMIZERS
from tests.runtime.test_workloads_equivalence import (
    test_three_steps_match_eager as three_steps_match_eager,
)

PAPER_PARAMS = {"llama2-7b": 6_738_415_616, "gpt2-xl": 1_557_611_200}   # the published checkpoints
PAPER = {"llama2-7b": (8, 2048, torch.bfloat16), "gpt2-xl": (16, 1024, torch.float32)}


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry_keeps_table_2_apart() -> None:
    assert LLM_WORKLOAD_NAMES == ("llama2-7b", "gpt2-xl")
    assert not set(LLM_WORKLOAD_NAMES) & set(WORKLOAD_NAMES)
    assert ALL_WORKLOAD_NAMES == WORKLOAD_NAMES + LLM_WORKLOAD_NAMES
    assert [w.name for w in list_workloads()] == list(ALL_WORKLOAD_NAMES)
    with pytest.raises(ValueError, match="gpt2-xl"):
        get_workload("gpt2-xxl")


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", LLM_WORKLOAD_NAMES)
def test_tiny_three_steps_match_eager(name: str, optimizer: str) -> None:
    three_steps_match_eager(name, optimizer)


@pytest.mark.parametrize("name", LLM_WORKLOAD_NAMES)
def test_paper_builds_on_meta_with_the_published_size(name: str) -> None:
    inst = get_workload(name).build("paper")
    batch, seq, dtype = PAPER[name]
    assert inst.dtype == dtype and inst.model.training
    assert all(p.device.type == "meta" and p.dtype == dtype for p in inst.model.parameters())
    assert [tuple(t.shape) for t in inst.batch] == [(batch, seq)] * 3
    assert _params(inst.model) == PAPER_PARAMS[name]
    assert all(m.p == 0.0 for m in inst.model.modules() if isinstance(m, torch.nn.Dropout))
    assert inst.model.config.use_cache is False
    assert inst.model.config._attn_implementation == "eager"


def test_paper_architectures() -> None:
    llama = llama2_7b_config("paper")
    assert (llama.num_key_value_heads, llama.rms_norm_eps, llama.max_position_embeddings) == (32, 1e-5, 4096)
    assert not llama.tie_word_embeddings and llama.hidden_act == "silu"
    gpt2 = gpt2_xl_config("paper")
    assert (gpt2.n_layer, gpt2.n_embd, gpt2.n_head, gpt2.vocab_size) == (48, 1600, 25, 50257)
    assert gpt2.tie_word_embeddings and gpt2.activation_function == "gelu_new"
    assert llama2_7b_config("paper", n_layer=2).num_hidden_layers == 2


def test_gpt2_xl_deepened_to_96_layers() -> None:
    assert gpt2_xl_config("paper", n_layer=96).n_layer == 96
    inst = deepened_gpt2_xl(96)
    assert len(inst.model.transformer.h) == 96
    assert all(p.device.type == "meta" for p in inst.model.parameters())
    per_layer = 12 * 1600**2 + 13 * 1600       # attention and MLP weights, biases, two LayerNorms
    assert _params(inst.model) == PAPER_PARAMS["gpt2-xl"] + 48 * per_layer
    assert "96 layers" in inst.description
    assert len(get_workload("gpt2-xl").build("paper").model.transformer.h) == 48   # the registry is untouched


@pytest.mark.parametrize("name", LLM_WORKLOAD_NAMES)
def test_medium_is_scaled_as_its_facts_say(name: str) -> None:
    """Built on meta (a real medium step holds 3-5 GB; bench.medium_sizes measures them)."""
    workload = get_workload(name)
    facts = workload.facts("medium")
    with torch.device("meta"):
        model, batch = workload.make("medium", int(facts["batch"]))
    assert tuple(batch[0].shape) == (1, 128)
    assert model.config.num_hidden_layers == facts["layers"]
    assert model.config.vocab_size == facts.get("vocab", model.config.vocab_size)
    assert model.config.hidden_size == {"llama2-7b": 4096, "gpt2-xl": 1600}[name]
    assert facts["params"] == f"{_params(model) / 1e6:.0f}M"
