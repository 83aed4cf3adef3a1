"""Captured output dtypes are what the real kernels return (capture/realcheck.py).

Under torch.autocast("cpu", dtype=torch.bfloat16) a LayerNorm whose input comes out of a bf16
matmul runs native_layer_norm on a bf16 input with fp32 weight: the real CPU kernel returns fp32
mean/rstd, its fake kernel says bf16. A plan that swaps the statistics out then feeds bf16 to
native_layer_norm_backward, which fails; these tests pin the real dtypes, the byte sizes, and
plans that swap or recompute the statistics matching eager.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from transformers import BertConfig, BertForMaskedLM

import peakcut
from peakcut.capture import convert, realcheck
from peakcut.capture.convert import FakeDtypesTag
from peakcut.capture.realcheck import RealCheck, real_output_dtypes
from peakcut.codegen.program import Step
from peakcut.ir.real_dtypes import KNOWN, known_real_dtypes, real_call_dtypes
from peakcut.ir.tags import NO_TAGS
from peakcut.transform import remat, swap

aten = torch.ops.aten
BF16 = torch.bfloat16
# eager and the generated step run the same kernels; allow a couple of bf16 roundings
TOL = 2 * torch.finfo(BF16).eps


def bf16_mlm_loss(m, b):
    with torch.autocast("cpu", dtype=BF16):
        logits = m(input_ids=b[0]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), b[0].flatten())


def bf16_square_loss(m, b):
    with torch.autocast("cpu", dtype=BF16):
        out = m(b[0])
    return out.float().square().mean()


def capture_keeping_fx(model, batch, loss_fn, check=None):
    """capture(..., optimizer=None), also returning the FX graph the real-run check saw;
    `check` replaces real_output_dtypes."""
    seen = []
    real = convert.real_output_dtypes if check is None else check
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(convert, "real_output_dtypes", lambda gm, **kw: (seen.append(gm), real(gm, **kw))[1])
        g = peakcut.capture(model, batch, loss_fn, None)
    return g, seen[-1]


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, attn_implementation="eager",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model, batch = BertForMaskedLM(cfg), (torch.randint(0, 64, (2, 8)),)
    g, gm = capture_keeping_fx(model, batch, bf16_mlm_loss)
    return model, batch, g, gm


@pytest.fixture(scope="module")
def group_norm_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 5))
    batch = (torch.randn(2, 3, 6, 6),)
    g, _ = capture_keeping_fx(model, batch, bf16_square_loss)
    return model, batch, g


def node_of(g, op, bf16_input=True):
    for nid in g.order:
        n = g.nodes[nid]
        if n.op != op:
            continue
        x = n.args[1] if op.endswith("_backward.default") else n.args[0]
        if (g.tensors[x.id].dtype == "bfloat16") == bf16_input:
            return nid
    raise AssertionError(f"no {op} node")


def dtypes(g, nid):
    return [None if t is None else g.tensors[t].dtype for t in g.nodes[nid].outputs]


def grads_after(model, batch, loss_fn=None, step=None):
    m = copy.deepcopy(model)
    if step is None:
        loss = loss_fn(m, batch)
        loss.backward()
    else:
        loss = step(m, batch)
    return loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


def assert_matches_eager(model, batch, loss_fn, graph, order):
    loss, grads = grads_after(model, batch, loss_fn)
    got_loss, got = grads_after(model, batch, step=Step(graph, order))
    torch.testing.assert_close(got_loss, loss, rtol=TOL, atol=TOL)
    assert got.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(got[name], grads[name], rtol=TOL, atol=TOL, msg=name)


# ---------------------------------------------------------------- the table
def _ln():
    x, w = torch.full((2, 3, 4), 0.5, dtype=BF16), torch.ones(4)
    return aten.native_layer_norm.default, (x, [4], w, torch.zeros(4), 1e-5)


def _gn():
    return aten.native_group_norm.default, (torch.full((2, 4, 3), 0.5, dtype=BF16), torch.ones(4),
                                            torch.zeros(4), 2, 4, 3, 2, 1e-5)


def _bn(op, n_stats, *flags):
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)).to(BF16)
    stats = [torch.zeros(4), torch.ones(4)][:n_stats]
    return op, (x, torch.ones(4), torch.zeros(4), *stats, *flags, 0.1, 1e-5)


def _gn_backward():
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)).to(BF16)
    _, mean, rstd = aten.native_group_norm(x, torch.ones(4), torch.zeros(4), 2, 4, 3, 2, 1e-5)
    return aten.native_group_norm_backward.default, (x.clone(), x, mean, rstd, torch.ones(4), 2, 4, 3, 2,
                                                     [True, True, True])


CALLS = {
    "aten.native_layer_norm.default": _ln,
    "aten.native_group_norm.default": _gn,
    "aten.native_batch_norm.default": lambda: _bn(aten.native_batch_norm.default, 2, True),
    "aten._native_batch_norm_legit.default": lambda: _bn(aten._native_batch_norm_legit.default, 2, True),
    "aten._native_batch_norm_legit.no_stats": lambda: _bn(aten._native_batch_norm_legit.no_stats, 0, True),
    "aten._native_batch_norm_legit_no_training.default":
        lambda: _bn(aten._native_batch_norm_legit_no_training.default, 2),
    "aten._native_batch_norm_legit_functional.default":
        lambda: _bn(aten._native_batch_norm_legit_functional.default, 2, True),
    "aten.native_group_norm_backward.default": _gn_backward,
}


def test_every_known_entry_has_a_call():
    assert set(KNOWN["cpu"]) == set(CALLS)


@pytest.mark.parametrize("op_name", sorted(CALLS))
def test_known_table_gives_the_real_kernels_dtypes(op_name):
    """Mixed bf16 input / fp32 weight: KNOWN corrects the fake kernel to what the CPU kernel returns."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, args = CALLS[op_name]()
    real = tuple(o.dtype for o in op(*args))
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = tuple(o.dtype for o in op(*fake_args))
    arg_dtypes = [a.dtype if isinstance(a, torch.Tensor) else None for a in args]
    known = known_real_dtypes(op_name, arg_dtypes, fake, "cpu")
    assert (known or fake) == real
    assert real_call_dtypes(op_name, args, [torch.empty(0, dtype=d) for d in fake], "cpu") == real
    # one dtype throughout: the rule does not apply
    same = [a.to(BF16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    assert known_real_dtypes(op_name, [a.dtype if isinstance(a, torch.Tensor) else None for a in same],
                             fake, "cpu") is None


# ---------------------------------------------------------------- BERT under bf16 autocast
def test_layer_norm_statistics_are_float32(bert):
    _, _, g, _ = bert
    ln = node_of(g, "aten.native_layer_norm.default")
    assert dtypes(g, ln) == ["bfloat16", "float32", "float32"]
    assert g.nodes[ln].tags.get(FakeDtypesTag) == FakeDtypesTag(("bfloat16", "bfloat16", "bfloat16"))
    for t in g.nodes[ln].outputs[1:]:
        meta = g.tensors[t]
        assert g.storages[meta.storage] == meta.numel * 4  # what the simulation counts
    # the backward reads them as fp32, and LayerNorms of fp32 inputs are untouched
    (bwd,) = [u for u in g.users(g.nodes[ln].outputs[1])]
    assert g.nodes[bwd].op == "aten.native_layer_norm_backward.default"
    fp32 = node_of(g, "aten.native_layer_norm.default", bf16_input=False)
    assert dtypes(g, fp32) == ["float32"] * 3 and g.nodes[fp32].tags == NO_TAGS


def test_fake_statistics_would_break_a_swap(bert):
    """Without the check the graph says bf16, and swapping the statistics out fails at run time."""
    model, batch, _, _ = bert
    g, _ = capture_keeping_fx(model, batch, bf16_mlm_loss, check=lambda gm, **kw: RealCheck())
    ln = node_of(g, "aten.native_layer_norm.default")
    assert dtypes(g, ln) == ["bfloat16"] * 3
    rstd = g.nodes[ln].outputs[2]
    r = swap(g, g.order, rstd, g.users(rstd))
    with pytest.raises(RuntimeError, match="expected scalar type"):
        grads_after(model, batch, step=Step(r.graph, r.order))


@pytest.mark.parametrize("how", ["swap", "remat"])
def test_plans_on_the_statistics_match_eager(bert, how):
    model, batch, g, _ = bert
    ln = node_of(g, "aten.native_layer_norm.default")
    _, mean, rstd = g.nodes[ln].outputs
    if how == "swap":
        r = swap(g, g.order, mean, g.users(mean))
        r = swap(r.graph, r.order, rstd, r.graph.users(rstd))
        hosts = [t for n in r.added for t in r.graph.nodes[n].output_ids()]
        assert {r.graph.tensors[t].dtype for t in hosts} == {"float32"}
    else:
        r = remat(g, g.order, ln, g.users(rstd))
        (again,) = r.added
        assert dtypes(r.graph, again) == ["bfloat16", "float32", "float32"]
    assert_matches_eager(model, batch, bf16_mlm_loss, r.graph, r.order)


def test_narrow_check_finds_what_every_check_finds(bert, monkeypatch):
    _, _, _, gm = bert
    narrow = real_output_dtypes(gm)
    assert [str(n.target) for n in narrow.dtypes] == ["aten.native_layer_norm.default"]
    assert any("native_layer_norm" in note and "float32" in note for note in narrow.notes)
    assert 0 < narrow.real_runs < narrow.checked and narrow.unchecked == 0  # cached per signature
    assert real_output_dtypes(gm, select="all").dtypes == narrow.dtypes
    assert real_output_dtypes(gm, run_real=False).dtypes == narrow.dtypes  # KNOWN alone
    monkeypatch.setattr(realcheck, "FULL_SIZE_BYTES", 0)  # every call shrunk
    shrunk = real_output_dtypes(gm, select="all")
    assert shrunk.dtypes == narrow.dtypes and shrunk.unchecked == 0


def test_large_calls_run_shrunk_or_fall_back_to_the_table():
    """A 1.5 MiB LayerNorm runs shrunk; group_norm_backward's N/C/HxW arguments cannot be
    shrunk generically, so KNOWN fixes it without a real run."""
    def f(x, w, b):
        out, mean, rstd = aten.native_layer_norm(x, [768], w, b, 1e-5)
        y = out.view(8, 768, 128)
        _, m2, r2 = aten.native_group_norm(y, w, b, 8, 768, 128, 4, 1e-5)
        grads = aten.native_group_norm_backward(y, y, m2, r2, w, 8, 768, 128, 4, [True, True, True])
        return mean, rstd, m2, r2, grads
    gm = make_fx(f, tracing_mode="fake")(torch.ones(8, 128, 768, dtype=BF16), torch.ones(768), torch.zeros(768))
    check = real_output_dtypes(gm)
    fixed = {str(n.target): d for n, d in check.dtypes.items()}
    assert fixed == {
        "aten.native_layer_norm.default": (BF16, torch.float32, torch.float32),
        "aten.native_group_norm.default": (BF16, torch.float32, torch.float32),
        "aten.native_group_norm_backward.default": (BF16, torch.float32, torch.float32),
    }
    assert check.real_runs == 1 and check.unchecked == 2


# ---------------------------------------------------------------- GroupNorm: a wrong backward dtype
def test_group_norm_backward_input_grad_is_bf16(group_norm_cnn):
    model, batch, g = group_norm_cnn
    gn = node_of(g, "aten.native_group_norm.default")
    assert dtypes(g, gn) == ["bfloat16", "float32", "float32"]
    bwd = node_of(g, "aten.native_group_norm_backward.default")
    assert dtypes(g, bwd) == ["bfloat16", "float32", "float32"]
    assert (tag := g.nodes[bwd].tags.get(FakeDtypesTag)) is not None and tag.dtypes[0] == "float32"
    rstd = g.nodes[gn].outputs[2]
    r = swap(g, g.order, rstd, g.users(rstd))
    assert_matches_eager(model, batch, bf16_square_loss, r.graph, r.order)
