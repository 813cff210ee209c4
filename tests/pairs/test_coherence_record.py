"""The update error's coherence in a lockstep pair: measured on arm b's own weights, recorded at the
cadence's steps, training unchanged, resumed exactly; pairs that cannot be switched say why."""

import math

import pytest
import torch

from divergence.loggers.step_logging import step_metrics
from divergence.metrics.coherence import coherence
from divergence.training.lockstep import train_pair
from divergence.training.update_error import UpdateError, not_measurable

from .helpers import DIT, pair_recipe, step_records

SMALL = ("train.max_steps=4", "tracking.dense=[]", "tracking.every=2", "tracking.probe.enabled=false")
COHERENCE_KEYS = ("coherence", "coherence_steps", "coherence_cos", "coherence_err", "coherence_layers")


def test_flash_pair_records_coherence_at_its_cadence_and_trains_as_without(tmp_path):
    """On the DiT (the UNet's update error: the next test)."""
    on = pair_recipe("dit-flash-vs-baseline", *SMALL, "tracking.coherence_every=2")
    train_pair(on, tmp_path / "on")
    steps = step_records(tmp_path / "on")
    assert [s for s, r in steps.items() if "coherence" in r] == [2, 4]  # step 2 and 4: updates of batches 1 and 3
    last = steps[4]
    assert last["coherence_steps"] == 2 and 0 < last["coherence"] <= math.sqrt(2) + 1e-9
    assert -1 <= last["coherence_cos"] <= 1 and last["coherence_err"] > 0 and last["coherence_grad"] > 0
    assert last["coherence_layers"] and all(
        name.startswith(("unet.", "text_encoder.")) for name in last["coherence_layers"]
    )
    logged = step_metrics(last)
    assert logged["divergence/coherence/model"] == last["coherence"]
    assert 0 < logged["divergence/coherence/rel_err"] < 1  # an attention kernel's gradient error is small
    assert any(k.startswith("divergence/coherence/layer/") for k in logged)
    without = pair_recipe("dit-flash-vs-baseline", *SMALL, "tracking.coherence_every=0")  # off (the pair's own: 3)
    train_pair(without, tmp_path / "off")
    off = step_records(tmp_path / "off")
    assert all(off[s]["loss_a"] == steps[s]["loss_a"] and off[s]["loss_b"] == steps[s]["loss_b"] for s in (1, 2, 3, 4))
    # crashed after step 3 and resumed from the step-2 checkpoint: the running sums come back with it
    from tests.training.test_train import Crash

    resumed = pair_recipe("dit-flash-vs-baseline", *SMALL, "tracking.coherence_every=2", "train.checkpoint_every=2")
    with pytest.raises(SystemError):
        train_pair(resumed, tmp_path / "resumed", callbacks=[Crash(3)])
    train_pair(resumed, tmp_path / "resumed")
    again = step_records(tmp_path / "resumed")
    assert [again[4][k] for k in COHERENCE_KEYS] == [last[k] for k in COHERENCE_KEYS]


def test_update_error_is_the_gradient_difference_of_the_two_kernels_on_one_arm():
    pair = pair_recipe("flash-vs-baseline")
    from divergence.models.attention import verify_attention
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs

    inputs = Inputs(pair.arm_recipes["b"])
    arm = Arm(pair.arm_recipes["b"], inputs.tokenizer)
    arm.setup(torch.device("cpu"))
    batch = inputs.prepare(inputs.batches.batch(0))
    measured = UpdateError(arm, pair.arm_recipes["a"])
    errors, grad_norm = measured.measure(batch)
    verify_attention(arm.unet, arm.processors)  # the arm's own processors back in place
    assert grad_norm > 0 and 0 < sum(float(e.norm() ** 2) for e in errors.values()) ** 0.5 < grad_norm
    again, _ = measured.measure(batch)  # deterministic on the CPU: the same error twice
    assert all(torch.equal(errors[n], again[n]) for n in errors)
    c = coherence([torch.cat(list(errors.values()))] * 4)
    assert abs(c["coherence"] - 2.0) < 1e-12  # one error repeated drifts: C(4) = sqrt(4)


def test_pairs_that_cannot_be_switched_on_one_model_say_why(tmp_path):
    seed = pair_recipe("seed-vs-seed")
    assert not_measurable(seed.arm_recipes["b"], seed.arm_recipes["a"]).startswith(
        "not measurable: the arms differ in model.seed"
    )
    for name in ("flash-vs-baseline", "bf16-vs-fp32", "control"):
        p = pair_recipe(name)
        assert not_measurable(p.arm_recipes["b"], p.arm_recipes["a"]) is None, name
    train_pair(pair_recipe("seed-vs-seed", *DIT, *SMALL, "train.max_steps=2", "tracking.coherence_every=2"), tmp_path)
    record = step_records(tmp_path)[2]
    assert "coherence" not in record and record["coherence_status"].startswith("not measurable: the arms differ")
