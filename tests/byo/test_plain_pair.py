"""``divergence.Pair``: two models of one plain PyTorch loop, compared in memory into the pair folder.

Its store is the store ``divergence watch`` builds from the same two arms written by ``ArmWriter``
as separate jobs, record for record; a restart at a stored step continues it as if uninterrupted.
"""

import json
import math

import pytest
import torch

import divergence
from divergence.errors import ScriptError
from divergence.store import MetricsStore
from tests.byo.test_watch_result import two_arms

LRS = {"a": 0.1, "b": 0.1001}  # the arms of ``two_arms``


def _models():
    models = []
    for _ in LRS:
        torch.manual_seed(0)
        models.append(torch.nn.Linear(4, 3))
    return models


def _train(pair, models, steps, first=1, fail_at=None):
    """``two_arms``'s loop, both arms in it; the optimizers are rebuilt (SGD without momentum: stateless)."""
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m, lr in zip(models, LRS.values())]
    for step in range(first, steps + 1):
        losses = []
        for model, opt in zip(models, optimizers):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)
        if step == fail_at:
            raise KeyboardInterrupt  # the loop dies before recording this step
        pair.record(step, *losses)


def _lines(out):
    """The store's lines as parsed JSON (NaN losses at step 0 compare equal as text)."""
    return [json.dumps(json.loads(line), sort_keys=True) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_store_is_the_one_watch_builds_from_the_same_arms(tmp_path):
    watched, paired = tmp_path / "watched", tmp_path / "paired"
    two_arms(watched, steps=6, every=2)
    assert divergence.watch(watched, poll=0.05, timeout=30, logs=False, quiet=True).complete
    models = _models()
    with divergence.Pair(paired, *models, max_steps=6, every=2, dense=[]) as pair:  # ``two_arms``'s schedule
        _train(pair, models, 6)
    assert _lines(paired) == _lines(watched)
    records = MetricsStore(paired).step_records()
    assert [r["step"] for r in records if r["tracked"]] == [0, 2, 4, 6]
    assert records[-1]["max_abs_diff"] > 0  # the learning rates differ
    info = json.loads((paired / "pair.json").read_text())
    assert info["finished"] is True and info["last_step"] == 6


def test_a_restart_at_a_stored_step_continues_as_if_uninterrupted(tmp_path):
    whole, restarted = tmp_path / "whole", tmp_path / "restarted"
    models = _models()
    with divergence.Pair(whole, *models, max_steps=8, every=3, name="lr") as pair:
        _train(pair, models, 8)
    models = _models()
    with pytest.raises(KeyboardInterrupt):
        with divergence.Pair(restarted, *models, max_steps=8, every=3, name="lr") as pair:
            _train(pair, models, 3)
            saved = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]  # the loop's checkpoint
            _train(pair, models, 8, first=4, fail_at=6)
    assert MetricsStore(restarted).last_step() == 5
    assert json.loads((restarted / "pair.json").read_text())["finished"] is False
    for model, state in zip(models, saved):
        model.load_state_dict(state)
    with divergence.Pair(restarted, *models, max_steps=8, every=3, name="lr", start_step=3) as pair:
        _train(pair, models, 8, first=4)
    assert _lines(restarted) == _lines(whole)


def test_a_fresh_run_over_stored_steps_is_refused_unless_resume(tmp_path):
    models = _models()
    with divergence.Pair(tmp_path, *models, max_steps=2, every=1) as pair:
        _train(pair, models, 2)
    with pytest.raises(ScriptError, match=r"steps 0 to 2 stored.*Pair\(\.\.\., start_step=G\).*resume=True"):
        divergence.Pair(tmp_path, *_models(), max_steps=2, every=1)
    with pytest.raises(ScriptError, match="holds steps 0 to 2, so the steps up to 5 would be missing"):
        divergence.Pair(tmp_path, *_models(), max_steps=9, every=1, start_step=5)
    models = _models()
    with divergence.Pair(tmp_path, *models, max_steps=1, every=1, resume=True) as pair:
        _train(pair, models, 1)
    assert MetricsStore(tmp_path).steps() == [0, 1]


def test_another_pair_and_a_second_writer_are_refused(tmp_path):
    with divergence.Pair(tmp_path, *_models(), max_steps=2, name="one"):
        with pytest.raises(ScriptError, match="pid"):
            divergence.Pair(tmp_path, *_models(), max_steps=2, name="one")
    with pytest.raises(ScriptError, match="holds pair 'one' with name 'one', not 'two'"):
        divergence.Pair(tmp_path, *_models(), max_steps=2, name="two", resume=True)


def test_the_step_rules_and_the_losses_are_checked_in_one_line(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ScriptError, match="the same object"):
        divergence.Pair(tmp_path / "same", model, model, max_steps=2)
    with pytest.raises(ScriptError, match=r"Pair\(max_steps=0\): must be an integer >= 1"):
        divergence.Pair(tmp_path / "zero", *_models(), max_steps=0)
    pair = divergence.Pair(tmp_path / "p", *_models(), max_steps=3)
    with pytest.raises(ScriptError, match=r"Pair.record\(2, ...\): step 2 skips step 1"):
        pair.record(2, 1.0, 1.0)
    with pytest.raises(ScriptError, match=r"loss_b: loss is a Tensor of shape \(2,\)"):
        pair.record(1, 1.0, torch.ones(2))
    pair.record(1, 1.0, 2.0)
    with pytest.raises(ScriptError, match="step 1 is recorded already"):
        pair.record(1, 1.0, 2.0)
    pair.finish()
    with pytest.raises(ScriptError, match="the pair has finished"):
        pair.record(2, 1.0, 1.0)
    assert json.loads((tmp_path / "p" / "pair.json").read_text())["finished"] is False  # step 3 never came


def test_a_nonfinite_loss_is_recorded_then_stops_the_pair(tmp_path):
    pair = divergence.Pair(tmp_path, *_models(), max_steps=5)
    pair.record(1, 1.0, 1.0)
    with pytest.raises(ScriptError, match=r"arm b: loss is nan at step 2 \(recorded in"):
        with pair:
            pair.record(2, 1.0, math.nan)
    assert math.isnan(MetricsStore(tmp_path).step_records()[-1]["loss_b"])
    divergence.Pair(tmp_path, *_models(), max_steps=5, start_step=1).close()  # the lock was dropped


def test_a_restart_rebuilds_the_spike_detectors_from_the_stored_losses(tmp_path):
    """A loss 10x the median of the 20 before it is a spike, also when those 20 were stored before a restart."""
    models = _models()
    with pytest.raises(KeyboardInterrupt):
        with divergence.Pair(tmp_path, *models, max_steps=30, every=10) as pair:
            for step in range(1, 23):
                pair.record(step, 1.0, 1.0)
            raise KeyboardInterrupt
    with divergence.Pair(tmp_path, *models, max_steps=30, every=10, start_step=22) as pair:
        pair.record(23, 10.0, 1.0)
    last = MetricsStore(tmp_path).step_records()[-1]
    assert (last["step"], last["spike_a"], last["spike_b"]) == (23, True, False)
