"""``ArmWriter`` from a plain PyTorch loop: the pair folder, watch's store, a restart, mistakes.

The comparator's records at a tracked step equal ``divergence_records`` of the two models'
weights in memory, exactly: the files hold the same fp32 tensors.
"""

import json
import math

import pytest
import torch

from divergence.comparator.follow import Comparator
from divergence.errors import UserInputError
from divergence.store import MetricsStore
from divergence.tracking.records import divergence_records
from divergence.writers import ArmWriter
from divergence.writers.arm_writer import state_weights

STEPS = 6


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def train(out, arm: str, lr: float, steps: int = STEPS, start_step: int = 0, model=None, stop_at=None):
    model = model or net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(1)
    writer = ArmWriter(out, arm, max_steps=steps, every=2, start_step=start_step, name="sgd-lr", dense=[])
    if start_step == 0:
        writer.record(0, model)
    for step in range(1, steps + 1):
        x = torch.randn(16, 4, generator=data)
        if step <= start_step:
            continue
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.record(step, model, loss)
        if step == stop_at:
            return model, writer  # "killed": no finish()
    writer.finish()
    return model, writer


def test_two_arms_and_watch_give_the_records_of_the_weights(tmp_path):
    model_a, _ = train(tmp_path, "a", lr=0.1)
    model_b, _ = train(tmp_path, "b", lr=0.12)
    assert Comparator(tmp_path, log=False, progress=False).run(poll=0.05, timeout=10) == 0
    store = MetricsStore(tmp_path)
    assert store.steps() == list(range(STEPS + 1))
    assert [r["step"] for r in store.step_records() if r["tracked"]] == [0, 2, 4, 6]
    tensors, summary = divergence_records(state_weights(model_a), state_weights(model_b))
    stored = [r for r in store.tensor_records() if r["step"] == STEPS]
    assert [{k: v for k, v in r.items() if k not in ("type", "step")} for r in stored] == tensors
    last = store.step_records()[-1]
    assert last["max_abs_diff"] == summary["max_abs_diff"] > 0
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "a" / "losses.jsonl")]
    assert last["loss_a"] == losses[-1] and math.isnan(store.step_records()[0]["loss_a"])
    info = json.loads((tmp_path / "pair.json").read_text())
    assert info["name"] == "sgd-lr" and info["category"] == "optimization" and info["finished"]


def test_a_restarted_arm_cuts_what_it_recomputes(tmp_path):
    model, _ = train(tmp_path, "a", lr=0.1, stop_at=5)
    assert (tmp_path / "a" / "checkpoints" / "step_000004.safetensors").is_file()
    # restart from a checkpoint of step 3: steps 4 and 5 are computed again
    model_3 = net()
    train(tmp_path, "a", lr=0.1, model=model_3, steps=STEPS, start_step=3)
    status = json.loads((tmp_path / "a" / "status.json").read_text())
    assert status["attempt"] == 2 and status["start_step"] == 3 and status["state"] == "finished"
    steps = [json.loads(line)["step"] for line in open(tmp_path / "a" / "losses.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_mistakes_are_named(tmp_path):
    with pytest.raises(UserInputError, match="arm='c'"):
        ArmWriter(tmp_path, "c", max_steps=3)
    with pytest.raises(UserInputError, match="max_steps=0"):
        ArmWriter(tmp_path, "a", max_steps=0)
    writer = ArmWriter(tmp_path, "a", max_steps=3, every=1)
    with pytest.raises(UserInputError, match=r"call record\(0, model\)"):
        writer.record(1, net(), 0.5)
    with pytest.raises(UserInputError, match="the pair has max_steps=3, this arm max_steps=4"):
        ArmWriter(tmp_path, "b", max_steps=4, every=1)
    silent = ArmWriter(tmp_path / "other", "a", max_steps=3, rank=1)  # not rank 0: writes nothing
    silent.record(0, net())
    silent.finish()
    assert not (tmp_path / "other").exists()
