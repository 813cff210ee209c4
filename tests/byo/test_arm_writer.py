"""``ArmWriter`` from a plain PyTorch loop: the pair folder, watch's store, a restart, mistakes.

The comparator's records at a tracked step equal ``divergence_records`` of the two models'
weights in memory, exactly: the files hold the same fp32 tensors.
"""

import json
import math

import pytest
import torch

from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.errors import UserInputError
from divergence.store import MetricsStore
from divergence.tracking.records import divergence_records
from divergence.writers import ArmWriter
from divergence.writers.arm_writer import state_weights
from tests.helpers import assert_one_line_message

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
            writer.lock.release()  # "killed": no finish(); the OS drops a dead process's lock
            return model, writer
    writer.finish()
    return model, writer


def test_two_arms_and_watch_give_the_records_of_the_weights(tmp_path):
    model_a, _ = train(tmp_path, "a", lr=0.1)
    model_b, _ = train(tmp_path, "b", lr=0.12)
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=10) == 0
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
    for bad in (0, "10", 2.0, True):
        with pytest.raises(UserInputError, match=f"max_steps={bad!r}: must be an integer >= 1, or None"):
            ArmWriter(tmp_path, "a", max_steps=bad)
    writer = ArmWriter(tmp_path, "a", max_steps=3, every=1)
    with pytest.raises(UserInputError, match=r"call record\(0, model\)"):
        writer.record(1, net(), 0.5)
    with pytest.raises(UserInputError, match="the pair has max_steps=3, this arm max_steps=4"):
        ArmWriter(tmp_path, "b", max_steps=4, every=1)
    silent = ArmWriter(tmp_path / "other", "a", max_steps=3, rank=1)  # not rank 0: writes nothing
    silent.record(0, net())
    silent.finish()
    assert not (tmp_path / "other").exists()


def _files(folder):
    """Every file under ``folder`` with its bytes (what a refused call must leave as it was)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(err) -> str:
    return assert_one_line_message(str(err.value))


def test_steps_are_checked_before_anything_is_written(tmp_path):
    """The issue's cases: record(3) after record(1) (watch then waited for step 2 forever), a
    duplicate, an earlier step, float, bool, negative (step_-00001.safetensors) and past-max steps."""
    model = net()
    writer = ArmWriter(tmp_path, "a", max_steps=4, every=1, dense=[])
    writer.record(0, model)
    writer.record(1, model, 0.5)
    before = _files(tmp_path)
    for step, match in (
        (3, "step 3 skips step 2"),
        (1, "step 1 is recorded already"),
        (0, "step 0 comes after step 1"),
        (2.0, r"step 2\.0 \(float\) is not an integer"),
        (True, r"step True \(bool\)"),
        (-1, "step -1 is negative"),
        (5, "step 5 is past max_steps=4"),
    ):
        with pytest.raises(UserInputError, match=match) as err:
            writer.record(step, model, 0.25)
        assert str(tmp_path / "a") in _one_line(err) or "ArmWriter.record" in _one_line(err)
    assert _files(tmp_path) == before  # nothing written: no step_-00001.safetensors, no stray loss line
    for step in (2, 3, 4):
        writer.record(step, model, 0.25)
    writer.finish()
    assert [json.loads(line)["step"] for line in open(tmp_path / "a" / "losses.jsonl")] == [1, 2, 3, 4]


def test_the_loss_is_a_number_and_a_nonfinite_one_is_stored_as_it_is(tmp_path):
    model = net()
    writer = ArmWriter(tmp_path, "a", max_steps=3, every=1, dense=[])
    writer.record(0, model)
    for loss, match in (
        (torch.ones(3), r"a Tensor of shape \(3,\)"),
        ("0.5", r"loss '0.5' \(str\) is not a number"),
        (None, "give the step's loss"),
    ):
        with pytest.raises(UserInputError, match=match) as err:
            writer.record(1, model, loss)
        _one_line(err)
    writer.record(1, model, torch.tensor(float("inf")))
    writer.record(2, model, float("nan"))
    writer.record(3, model, torch.tensor([0.5]))
    writer.finish()
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "a" / "losses.jsonl")]
    assert losses[0] == math.inf and math.isnan(losses[1]) and losses[2] == 0.5


def test_a_tensor_added_mid_run_is_refused_naming_it(tmp_path):
    """The issue's case: present at step 2 but not at step 0, the report called the layer NaN/inf."""
    model = net()
    writer = ArmWriter(tmp_path, "a", max_steps=3, every=1, dense=[])
    writer.record(0, model)
    model.register_parameter("late", torch.nn.Parameter(torch.ones(2)))
    with pytest.raises(UserInputError, match="at step 1, tensor 'late' is new") as err:
        writer.record(1, model, 0.5)
    _one_line(err)
    assert not (tmp_path / "a" / "checkpoints" / "step_000001.safetensors").exists()
    assert not (tmp_path / "a" / "losses.jsonl").exists()


def test_a_rerun_is_refused_unless_it_resumes(tmp_path):
    """The issue's case: a restart without start_step cut the arm's records after step 0 silently,
    and its later steps never matched up (watch waited forever)."""
    train(tmp_path, "a", lr=0.1)
    before = _files(tmp_path / "a")
    with pytest.raises(UserInputError, match="already holds arm a's records up to step 6 .finished, attempt 1.") as err:
        ArmWriter(tmp_path, "a", max_steps=STEPS, every=2, name="sgd-lr", dense=[])
    assert "start_step=G" in _one_line(err) and "resume=True" in str(err.value)
    assert _files(tmp_path / "a") == before  # nothing cut
    # told to: the arm is trained again from step 0, its records replaced
    writer = ArmWriter(tmp_path, "a", max_steps=STEPS, every=2, name="sgd-lr", dense=[], resume=True)
    assert not (tmp_path / "a" / "losses.jsonl").read_text()
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["step_000000.safetensors"]
    assert json.loads((tmp_path / "a" / "status.json").read_text())["attempt"] == 2
    writer.finish("failed")


def test_a_folder_of_another_pair_is_refused(tmp_path):
    train(tmp_path, "a", lr=0.1)  # pair "sgd-lr", category optimization
    before = _files(tmp_path)
    for pair, match in (
        ({"name": "other"}, "holds pair 'sgd-lr' with name 'sgd-lr', not 'other'"),
        ({"category": "control"}, "with category 'optimization', not 'control'"),
        ({"arms": {"a": "x", "b": "y"}}, "with arms"),
        ({"replicate": 1}, "with replicate 0, not 1"),
    ):
        with pytest.raises(UserInputError, match=match) as err:
            ArmWriter(tmp_path, "b", max_steps=STEPS, every=2, dense=[], **pair)
        _one_line(err)
    assert _files(tmp_path) == before and not (tmp_path / "b").exists()
    ArmWriter(tmp_path, "b", max_steps=STEPS, every=2, name="sgd-lr").finish("failed")  # the same pair: joins it
