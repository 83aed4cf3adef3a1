"""peakcut's Trainer against transformers' own: the same 10 steps, the same numbers.

A tiny random-weight Llama (about 4,400 parameters, sequences of 16 tokens, micro-batches of
4) trains 10 steps with the Trainer's defaults for an LLM fine-tune: fused AdamW (transformers'
default optimizer) with weight decay in its two param groups, a cosine schedule with warm-up,
`max_grad_norm=1.0` (the gradients' norm is above 1, so the clip acts), two micro-batches per
update, bf16 autocast, an evaluation and a checkpoint at step 5. The peakcut run stops at step
5 and a fresh Trainer on a fresh model resumes from that checkpoint. The 44 examples make 11
micro-batches an epoch, so the last accumulation group of an epoch holds one micro-batch.

Tolerance (as in tests/loop/test_transformer_loop.py and tests/loop/test_example.py). The plan
runs the captured ATen kernels of the step; a plan that splits or re-orders a reduction
rounds it differently in bf16 (u = 2^-9). AdamW turns any gradient into an update of about lr,
so a parameter whose gradient is rounding noise moves by noise, in eager too: parameters and
Adam moments are compared all together, relative to how far eager training moved them
(PARAM_TOL of it), the losses, the logged grad_norm and the evaluation loss within bf16
rounding of a reduction over the hidden size (tests.tolerance). Step counts, learning rates
and the scheduler's state are compared exactly. The parameter bound is tight enough to
matter: transformers' own run without the clip lies 4.8% of its movement away, one with a
learning rate 10% lower 9.9% (measured with this file's model, data and arguments). Where
the plan runs eager's kernels in eager's order, the numbers are equal bit for bit (they are
here, on a 2-core x86-64 CPU).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tolerance import tolerance

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH, HIDDEN = 64, 16, 4, 16
STEPS, CHECKPOINT = 10, 5
PARAM_TOL = 0.02         # of eager's movement, all parameters together (see the module docstring)
SEARCH = {"device": "cpu", "time_budget": 3, "max_states": 4}


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """One Llama layer (RMSNorm, RoPE, GQA, SwiGLU), weights large enough that the clip acts."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=SEQ, initializer_range=0.3,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start by a random stride (something to learn)."""

    def __init__(self, n: int, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        stride = torch.randint(1, 5, (n, 1), generator=gen)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(out: Path, **overrides: Any) -> Any:
    settings: dict[str, Any] = dict(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=2, learning_rate=1e-2, weight_decay=0.1, lr_scheduler_type="cosine",
        warmup_steps=2, max_grad_norm=1.0, bf16=True, logging_steps=1, eval_strategy="steps",
        eval_steps=CHECKPOINT, save_steps=CHECKPOINT, report_to=[], dataloader_num_workers=0, seed=0,
        use_cpu=True, disable_tqdm=True)
    settings.update(overrides)
    return transformers.TrainingArguments(**settings)


class StopAt(transformers.TrainerCallback):
    """Stops training after `step` (its checkpoint is still saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def run_pair(tmp_path: Path, make_model: Any, **overrides: Any) -> tuple[Any, Any, Any]:
    """transformers' Trainer for STEPS steps; peakcut's to CHECKPOINT, then a fresh peakcut
    Trainer on a fresh model resumed from its checkpoint to STEPS. Returns (eager, first, resumed)."""
    from peakcut.integrations.transformers import Trainer

    data, evals = Counting(44), Counting(8, seed=2)
    eager = transformers.Trainer(model=make_model(0), args=training_args(tmp_path / "eager", **overrides),
                                 train_dataset=data, eval_dataset=evals)
    eager.train()
    first = Trainer(model=make_model(0), args=training_args(tmp_path / "peakcut", **overrides),
                    train_dataset=data, eval_dataset=evals, callbacks=[StopAt(CHECKPOINT)], peakcut=SEARCH)
    first.train()
    resumed = Trainer(model=make_model(7), args=training_args(tmp_path / "peakcut", **overrides),
                      train_dataset=data, eval_dataset=evals, peakcut=SEARCH)
    resumed.train(resume_from_checkpoint=str(tmp_path / "peakcut" / f"checkpoint-{CHECKPOINT}"))
    return eager, first, resumed


def relative_difference(ours: list[torch.Tensor], theirs: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """||ours - theirs|| / ||theirs - start||, all tensors together."""
    num = sum(float(((a - b).double() ** 2).sum()) for a, b in zip(ours, theirs, strict=True))
    den = sum(float(((b - s).double() ** 2).sum()) for b, s in zip(theirs, start, strict=True))
    return math.sqrt(num / den)


def check_same_training(eager: Any, first: Any, resumed: Any, initial: list[torch.Tensor]) -> None:
    """Losses, grad_norm, learning rates and evaluation logged, parameters, AdamW state and the
    scheduler's state at the end: the peakcut runs against transformers' own."""
    assert first.peakcut_fallbacks == [] and resumed.peakcut_fallbacks == []
    assert first.peakcut_plan is not None and resumed.peakcut_plan is not None
    assert resumed.peakcut_plan.report["step"]["max_grad_norm"] == 1.0
    rtol = tolerance(torch.bfloat16, HIDDEN)

    def logged(trainer: Any, key: str) -> list[tuple[int, float]]:
        return [(e["step"], e[key]) for e in trainer.state.log_history if key in e]

    for key in ("loss", "grad_norm", "learning_rate", "eval_loss"):
        theirs, ours = logged(eager, key), logged(resumed, key)
        assert [s for s, _ in ours] == [s for s, _ in theirs] and len(theirs) >= 2, key
        for (step, a), (_, b) in zip(ours, theirs, strict=True):
            if key == "learning_rate":
                assert a == b, (key, step)
            else:
                assert a == pytest.approx(b, rel=rtol), (key, step, a, b)
    assert any(v > 1.0 for _, v in logged(eager, "grad_norm"))      # the clip acted
    assert eager.state.global_step == resumed.state.global_step == STEPS

    params = [p.detach() for p in resumed.model.parameters() if p.requires_grad]
    eager_params = [p.detach() for p in eager.model.parameters() if p.requires_grad]
    assert relative_difference(params, eager_params, initial) <= PARAM_TOL

    ours_opt, theirs_opt = resumed.optimizer.state_dict(), eager.optimizer.state_dict()
    assert ours_opt["param_groups"] == theirs_opt["param_groups"]
    assert ours_opt["state"].keys() == theirs_opt["state"].keys()
    for slot in ("exp_avg", "exp_avg_sq"):
        ours_s = [ours_opt["state"][i][slot] for i in sorted(ours_opt["state"])]
        theirs_s = [theirs_opt["state"][i][slot] for i in sorted(theirs_opt["state"])]
        assert relative_difference(ours_s, theirs_s, [torch.zeros_like(t) for t in theirs_s]) <= PARAM_TOL, slot
    assert all(float(s["step"]) == STEPS for s in ours_opt["state"].values())
    assert resumed.lr_scheduler.state_dict() == eager.lr_scheduler.state_dict()


def test_trainer_matches_transformers_trainer(tmp_path: Path) -> None:
    initial = [p.detach().clone() for p in tiny_llama(0).parameters()]
    eager, first, resumed = run_pair(tmp_path, tiny_llama)
    inner = first.optimizer.optimizer
    assert type(inner) is torch.optim.AdamW and inner.param_groups[0]["fused"]     # transformers' default
    assert [g["weight_decay"] for g in inner.param_groups] == [0.1, 0.0]
    check_same_training(eager, first, resumed, initial)


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    from peakcut.integrations.transformers import Trainer

    for settings, error, says in (({"memory": 0.5}, TypeError, "unknown setting 'memory'"),
                                  ({"time_budget": -1}, ValueError, "time_budget=-1"),
                                  ({"memory_limit": "lots"}, ValueError, "memory_limit='lots'")):
        with pytest.raises(error, match=says):
            Trainer(model=tiny_llama(), args=training_args(tmp_path), peakcut=settings)


def test_unsupported_optimizer_falls_back_with_its_name(tmp_path: Path) -> None:
    from peakcut.integrations.transformers import Trainer

    trainer = Trainer(model=tiny_llama(), args=training_args(tmp_path, optim="adagrad", max_steps=1,
                                                             eval_strategy="no", save_strategy="no"),
                      train_dataset=Counting(8), peakcut=SEARCH)
    with pytest.warns(UserWarning, match="transformers' own step: optimizer Adagrad"):
        trainer.train()
    assert trainer.peakcut_plan is None and trainer.state.global_step == 1


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "peakcut.integrations.transformers", raising=False)
    monkeypatch.setitem(sys.modules, "transformers", None)      # import transformers now fails
    with pytest.raises(ImportError, match=r"pip install peakcut\[transformers\]"):
        import peakcut.integrations.transformers  # noqa: F401


def test_example_trains_through_a_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/trainer_lm.py, for 2 steps with a short search: every step runs the plan and
    the Trainer logs the plan's grad_norm."""
    path = Path(__file__).resolve().parents[2] / "examples" / "trainer_lm.py"
    spec = importlib.util.spec_from_file_location("peakcut_example_trainer_lm", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="peakcut: peak limit not met")     # the short search's
        trainer = example.main(["--steps", "2", "--max-states", "2", "--time-budget", "2"])
    assert trainer.peakcut_plan is not None and trainer.peakcut_fallbacks == []
    assert trainer.state.global_step == 2
    norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    assert norms and all(n > 0 for n in norms)
    assert "Plan(peak" in capsys.readouterr().out


def with_cpu_grad_scaler(cls: Any) -> Any:
    """`cls` with fp16 as Accelerate sets it up on a GPU (autocast to float16 and a GradScaler),
    here on the CPU, where Accelerate itself makes neither. The scale starts at 2^21, which
    overflows this model's fp16 gradients: the first steps are skipped, later ones are not."""
    class WithScaler(cls):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            self.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 21, growth_interval=3)
            self.accelerator.native_amp = True
    return WithScaler


def test_fp16_grad_scaler_skips_the_steps_transformers_skips(tmp_path: Path) -> None:
    """fp16 with a GradScaler: the plan scales the loss, unscales, clips and skips the update on
    inf/nan as the Trainer does, and the Trainer holds its schedule on the skipped steps."""
    from peakcut.integrations.transformers import Trainer

    settings = dict(bf16=False, fp16=True, optim="adamw_torch", eval_strategy="no", save_strategy="no")
    data = Counting(44)
    eager = with_cpu_grad_scaler(transformers.Trainer)(
        model=tiny_llama(), args=training_args(tmp_path / "eager", **settings), train_dataset=data)
    eager.train()
    ours = with_cpu_grad_scaler(Trainer)(
        model=tiny_llama(), args=training_args(tmp_path / "peakcut", **settings), train_dataset=data, peakcut=SEARCH)
    ours.train()
    assert ours.peakcut_fallbacks == [] and ours.peakcut_plan is not None
    assert ours.peakcut_plan.report["step"]["grad_scaler"]
    logs = [[(e["step"], e["loss"], e["grad_norm"], e["learning_rate"]) for e in t.state.log_history if "loss" in e]
            for t in (eager, ours)]
    assert len(logs[0]) == len(logs[1]) == STEPS
    skipped = [step for step, _, norm, _ in logs[0] if not math.isfinite(norm)]
    assert skipped and len(skipped) < STEPS
    rtol = tolerance(torch.float16, HIDDEN)
    for (step, loss, norm, lr), (_, our_loss, our_norm, our_lr) in zip(*logs, strict=True):
        assert our_lr == lr and our_loss == pytest.approx(loss, rel=rtol), step
        assert (not math.isfinite(our_norm)) == (step in skipped), step
        assert step in skipped or our_norm == pytest.approx(norm, rel=rtol), step
    assert ours.accelerator.scaler.state_dict() == eager.accelerator.scaler.state_dict()
    assert ours.lr_scheduler.state_dict() == eager.lr_scheduler.state_dict()
    initial = [p.detach() for p in tiny_llama().parameters()]
    assert relative_difference([p.detach() for p in ours.model.parameters()],
                               [p.detach() for p in eager.model.parameters()], initial) <= PARAM_TOL


def test_gradient_checkpointing_is_captured_as_it_is(tmp_path: Path) -> None:
    """gradient_checkpointing=True: the model's torch.utils.checkpoint runs inside the plan
    (captured with its recompute), with two micro-batches per update. Where a checkpointed
    block's gradient reaches p.grad in parts (eager's inner backward accumulates them one by
    one; the plan adds their sum), the sums round differently: same tolerances as above."""
    from peakcut.integrations.transformers import Trainer

    settings = dict(gradient_checkpointing=True, max_steps=4, eval_strategy="no", save_strategy="no")
    data = Counting(44)
    eager = transformers.Trainer(model=tiny_llama(), args=training_args(tmp_path / "eager", **settings),
                                 train_dataset=data)
    eager.train()
    ours = Trainer(model=tiny_llama(), args=training_args(tmp_path / "peakcut", **settings), train_dataset=data,
                   peakcut=SEARCH)
    ours.train()
    assert ours.peakcut_fallbacks == [] and ours.peakcut_plan is not None
    rtol = tolerance(torch.bfloat16, HIDDEN)
    logs = [[(e["loss"], e["grad_norm"]) for e in t.state.log_history if "loss" in e] for t in (eager, ours)]
    assert len(logs[0]) == 4
    for (loss, norm), (our_loss, our_norm) in zip(*logs, strict=True):
        assert our_loss == pytest.approx(loss, rel=rtol) and our_norm == pytest.approx(norm, rel=rtol)
    initial = [p.detach() for p in tiny_llama().parameters()]
    assert relative_difference([p.detach() for p in ours.model.parameters()],
                               [p.detach() for p in eager.model.parameters()], initial) <= PARAM_TOL
