"""The Arm: its own precision and optimizer, and bitwise the same alone or in lockstep with another."""

import pytest
import torch

from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from tests.training.tiny import tiny_recipe

CPU = torch.device("cpu")


def _arm(recipe, inputs, name="arm"):
    arm = Arm(recipe, inputs.tokenizer, name=name)
    arm.setup(CPU)
    arm.configure_optimizers()
    return arm


def _equal_weights(a: Arm, b: Arm) -> bool:
    wa, wb = a.weights(), b.weights()
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_arm_alone_equals_arm_in_lockstep():
    recipe = tiny_recipe()
    inputs = Inputs(recipe)
    alone = _arm(recipe, inputs)
    paired, other = (
        _arm(recipe, inputs, "a"),
        _arm(tiny_recipe("train.precision=bf16-mixed", "model.seed=3"), inputs, "b"),
    )
    for step in range(2):
        batch = inputs.prepare(inputs.batches.batch(step))
        alone.training_step(batch)
        paired.training_step(batch)
        other.training_step(batch)
    assert _equal_weights(alone, paired)
    assert not _equal_weights(alone, other)


def test_weight_keys_are_prefixed_by_network():
    recipe = tiny_recipe()
    keys = _arm(recipe, Inputs(recipe)).weights().keys()
    assert {k.split(".")[0] for k in keys} == {"unet", "text_encoder"}
    assert "unet.conv_in.weight" in keys


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_on_cpu(precision):
    recipe = tiny_recipe(f"train.precision={precision}")
    inputs = Inputs(recipe)
    arm = _arm(recipe, inputs)
    out = arm.training_step(inputs.prepare(inputs.batches.batch(0)))  # fp16 on a CPU is slow: one step
    assert torch.isfinite(out.loss)
    assert (out.loss_scale == 65536.0) == (precision == "16-mixed")
    assert arm.unet.conv_in.weight.dtype == torch.float32  # fp32 master weights


def test_a_skipped_fp16_step_leaves_weights_alone_and_the_lower_scale_resumes():
    recipe = tiny_recipe("train.precision=16-mixed")
    inputs = Inputs(recipe)
    arm = _arm(recipe, inputs)
    arm.policy.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126)  # forces an overflow
    before = arm.unet.conv_in.weight.detach().clone()
    out = arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    assert out.skipped and torch.equal(before, arm.unet.conv_in.weight)
    resumed = Arm(recipe, inputs.tokenizer)
    resumed.load_train_state_dict(arm.train_state_dict())
    resumed.setup(CPU)
    resumed.configure_optimizers()
    assert resumed.policy.scaler.get_scale() == 2.0**125


def test_train_state_round_trip_continues_identically():
    recipe = tiny_recipe()
    inputs = Inputs(recipe)
    batches = [inputs.prepare(inputs.batches.batch(s)) for s in range(4)]
    straight = _arm(recipe, inputs)
    for b in batches:
        straight.training_step(b)
    first = _arm(recipe, inputs)
    for b in batches[:2]:
        first.training_step(b)
    resumed = Arm(recipe, inputs.tokenizer)
    resumed.load_state_dict(first.state_dict())
    resumed.load_train_state_dict(first.train_state_dict())  # before its optimizer exists
    resumed.setup(CPU)
    resumed.configure_optimizers()
    for b in batches[2:]:
        resumed.training_step(b)
    assert _equal_weights(straight, resumed)


def test_latent_space_and_v_prediction():
    recipe = tiny_recipe(
        "model.vae={block_out_channels: [8, 16], latent_channels: 4}", "noise.prediction_type=v_prediction"
    )
    inputs = Inputs(recipe)
    prepared = inputs.prepare(inputs.batches.batch(0))
    assert prepared.noisy.shape == prepared.target.shape == (2, 4, 16, 16)
    assert inputs.batches.batch(0).posterior is not None
    out = _arm(recipe, inputs).training_step(prepared)
    assert torch.isfinite(out.loss)
