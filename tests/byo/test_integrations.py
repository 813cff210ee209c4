"""The transformers ``Trainer`` with ``ArmWriterCallback``: two arms, then ``divergence watch``.

A tiny GPT-2 built from a config (no download) learns random token sequences; the arms
differ in the learning rate. The losses in ``losses.jsonl`` are the Trainer's own logged
losses, the weights files its model's at the tracked steps.

The ``Trainer`` (and even ``TrainingArguments``) needs the accelerate package; where it is
missing, the Trainer test is skipped and the callback is driven by transformers' own
``CallbackHandler`` (the object the Trainer calls its callbacks through) from a plain loop,
with a stand-in for ``TrainingArguments`` holding the two fields the callback reads.
"""

import json

import pytest
import torch

from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.errors import UserInputError
from divergence.store import MetricsStore

STEPS = 4


def arm_trainer(tmp_path, arm: str, lr: float, logging_steps: int = 1, save_steps: int | None = None):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from divergence.writers.transformers import ArmWriterCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    tokens = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir=str(tmp_path / f"hf-{arm}"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=lr,
        logging_steps=logging_steps,
        report_to=[],
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    callback = ArmWriterCallback(tmp_path / "pair", arm, every=2, name="gpt2-lr", dense=[])
    return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def test_transformers_trainer_arms(tmp_path):
    pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
    for arm, lr, save in (("a", 1e-3, 3), ("b", 2e-3, None)):
        arm_trainer(tmp_path, arm, lr, save_steps=save).train()
    pair = tmp_path / "pair"
    assert Comparator(pair, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=10) == 0
    store = MetricsStore(pair)
    assert store.steps() == list(range(STEPS + 1))
    assert [r["step"] for r in store.step_records() if r["tracked"]] == [0, 2, 4]
    last = store.step_records()[-1]
    assert last["wasserstein"] > 0 and last["loss_a"] != last["loss_b"]
    status = json.loads((pair / "b" / "status.json").read_text())
    assert status["state"] == "finished" and status["last_step"] == STEPS
    assert status["checkpoint_step"] == 0  # arm b saved no checkpoint: a restart starts over
    saved = json.loads((pair / "a" / "status.json").read_text())["checkpoint_step"]
    assert saved == 4 and (tmp_path / "hf-a" / "checkpoint-3").is_dir()  # its checkpoints at 3 and 4 reported


def handler_loop(out, arm: str, lr: float, logging_steps: int = 1):
    """The Trainer's event order (begin; per step: step_end, log with the step's loss; end) from a plain loop."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel, TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler

    from divergence.writers.transformers import ArmWriterCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    handler = CallbackHandler(
        [ArmWriterCallback(out, arm, every=2, name="gpt2-lr", dense=[])], model, None, optimizer, None
    )
    args = SimpleNamespace(logging_steps=logging_steps, logging_strategy="steps")  # TrainingArguments needs accelerate
    state, control = TrainerState(max_steps=STEPS, is_world_process_zero=True), TrainerControl()
    handler.on_train_begin(args, state, control)
    tokens = torch.randint(0, 32, (STEPS, 4, 8), generator=torch.Generator().manual_seed(1))
    for batch in tokens:
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.global_step += 1
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, {"loss": loss.item(), "learning_rate": lr})
    handler.on_train_end(args, state, control)


def test_callback_through_transformers_callback_handler(tmp_path):
    for arm, lr in (("a", 1e-3), ("b", 2e-3)):
        handler_loop(tmp_path, arm, lr)
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=10) == 0
    store = MetricsStore(tmp_path)
    assert [r["step"] for r in store.step_records() if r["tracked"]] == [0, 2, 4]
    assert store.step_records()[-1]["wasserstein"] > 0
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "a" / "losses.jsonl")]
    assert len(losses) == STEPS and store.step_records()[-1]["loss_a"] == losses[-1]


def test_a_logging_interval_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="logging_steps=1"):
        handler_loop(tmp_path, "a", 1e-3, logging_steps=5)


def test_a_nonfinite_loss_is_stored_as_nonfinite(tmp_path):
    """The issue's case: with learning_rate=1e30 the loss is non-finite from step 2 on, and the
    Trainer's logging_nan_inf_filter (on by default) logs it as the mean of the earlier ones
    (0.0 here); the store said loss_a 0.0 and no spike."""
    pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
    import math

    run = arm_trainer(tmp_path, "a", 1e30)
    run.train()
    logged = [h["loss"] for h in run.state.log_history if "loss" in h]
    stored = [json.loads(line)["loss"] for line in open(tmp_path / "pair" / "a" / "losses.jsonl")]
    assert len(stored) == STEPS and stored[0] == logged[0] and math.isfinite(stored[0])
    assert logged[1:] == [0.0] * (STEPS - 1)  # what the filter logs
    assert not any(math.isfinite(loss) for loss in stored[1:])  # what the model returned


def test_a_loss_the_callback_cannot_see_needs_the_filter_off(tmp_path):
    """A compute_loss of one's own leaves no loss in the model's output: the callback cannot see a
    non-finite one under the filter, so it asks for logging_nan_inf_filter=False."""
    pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
    from transformers import Trainer

    class OwnLoss(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            logits = model(input_ids=inputs["input_ids"]).logits  # no labels: the output holds no loss
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), inputs["labels"][:, 1:].flatten())

    base = arm_trainer(tmp_path, "a", 1e-3)
    run = OwnLoss(
        model=base.model,
        args=base.args,
        train_dataset=base.train_dataset,
        callbacks=[c for c in base.callback_handler.callbacks if type(c).__name__ == "ArmWriterCallback"],
    )
    with pytest.raises(UserInputError, match="set TrainingArguments.logging_nan_inf_filter=False."):
        run.train()
    run.args.logging_nan_inf_filter = False
    run.train()
    assert len(open(tmp_path / "pair" / "a" / "losses.jsonl").readlines()) == STEPS
