"""EMA weights (train.ema): diffusers' EMAModel stepped once per optimizer step, in checkpoints
beside the raw weights under ema.*, part of the resume state."""

import pytest
import torch
from safetensors.torch import load_file

from divergence.errors import RecipeError
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.single import train_run
from tests.training.test_train import Crash, _assert_bitwise_equal
from tests.training.tiny import DIT, tiny_recipe

CPU = torch.device("cpu")
EMA = "train.ema={decay: 0.9, update_after_step: 1, use_warmup: true, inv_gamma: 1.0, power: 0.75}"


def _decay(step: int, decay=0.9, after=1, inv_gamma=1.0, power=0.75) -> float:
    """EMAModel.get_decay with warm-up, written out (the reference)."""
    n = max(0, step - after - 1)
    return 0.0 if n <= 0 else min(1 - (1 + n / inv_gamma) ** -power, decay)


def _arm(recipe, inputs):
    arm = Arm(recipe, inputs.tokenizer)
    arm.setup(CPU)
    arm.configure_optimizers()
    return arm


def test_ema_follows_diffusers_formula_step_by_step():
    recipe = tiny_recipe(EMA, "model.text_encoder={train: true}")
    inputs = Inputs(recipe)
    arm = _arm(recipe, inputs)
    raw = lambda: {k: v.clone() for k, v in arm.weights().items() if not k.startswith("ema.")}  # noqa: E731
    expected = {f"ema.{name}": p.detach().clone() for name, p in arm.named_parameters() if p.requires_grad}
    assert list(expected) == [k for k in arm.weights() if k.startswith("ema.")]
    assert {k.split(".")[1] for k in expected} == {"unet", "text_encoder"}
    for step in range(1, 5):
        arm.training_step(inputs.prepare(inputs.batches.batch(step - 1)))
        weights, one_minus = raw(), 1 - _decay(step)
        for key, shadow in expected.items():
            shadow.sub_(one_minus * (shadow - weights[key[4:]]))  # EMAModel.step's update, elementwise
        got = arm.weights()
        assert all(torch.equal(got[k], v) for k, v in expected.items()), step
    assert arm.ema.model.cur_decay_value == pytest.approx(_decay(4)) and _decay(4) > 0
    assert not torch.equal(got["ema.unet.conv_in.weight"], got["unet.conv_in.weight"])


def test_ema_covers_only_trainable_weights():
    recipe = tiny_recipe("train.ema={decay: 0.99}", "model.text_encoder={train: false}")
    names = [k for k in Arm(recipe, Inputs(recipe).tokenizer).weights() if k.startswith("ema.")]
    assert names and all(k.startswith("ema.unet.") for k in names)
    assert "text_encoder.text_model.embeddings.position_ids" not in {k[4:] for k in names}


def test_no_ema_by_default_and_bad_settings_name_the_key():
    recipe = tiny_recipe()
    assert recipe.train.ema is None
    assert not [k for k in Arm(recipe, Inputs(recipe).tokenizer).weights() if k.startswith("ema.")]
    for bad, key in (
        ("{decay: 1.5}", "train.ema.decay"),
        ("{power: 0}", "train.ema.power"),
        ("{update_after_step: -1}", "train.ema.update_after_step"),
        ("{decay_rate: 0.9}", "decay_rate"),
    ):
        with pytest.raises(RecipeError, match=key):
            tiny_recipe(f"train.ema={bad}")
    with pytest.raises(RecipeError, match="train.ema: an EMA of LoRA factors"):
        tiny_recipe("train.ema={decay: 0.9}", "model.lora={rank: 2}")


def test_checkpoints_hold_both_and_resume_is_bitwise(tmp_path):
    """On the DiT (a step ~3x cheaper; the EMA of the UNet: the formula's test, its resume: test_train's)."""
    recipe = tiny_recipe(
        *DIT,
        EMA,
        "train.max_steps=5",
        "train.checkpoint_every=2",
        "sample.enabled=false",
        "log.csv=false",
        "train.accumulate=2",
    )
    train_run(recipe, tmp_path / "straight")
    with pytest.raises(SystemError, match="simulated crash"):
        train_run(recipe, tmp_path / "resumed", callbacks=[Crash(3)])  # last.ckpt holds step 2
    train_run(recipe, tmp_path / "resumed")
    for step in (4, 5):
        name = f"checkpoints/step_{step:06d}.safetensors"
        _assert_bitwise_equal(tmp_path / "straight" / name, tmp_path / "resumed" / name)
    last = load_file(str(tmp_path / "straight/checkpoints/step_000005.safetensors"))
    raw = {k for k in last if not k.startswith("ema.")}
    assert {k for k in last if k.startswith("ema.")} == {f"ema.{k}" for k in raw if "position_ids" not in k}
    conv = "unet.transformer.pos_embed.proj.weight"  # the patch embedding's
    assert not torch.equal(last[f"ema.{conv}"], last[conv])


def test_ema_of_sharded_weights_is_refused():
    with pytest.raises(RecipeError, match="train.ema: EMA of weights sharded by train.strategy=fsdp"):
        tiny_recipe("train.ema={decay: 0.9}", "train.strategy=fsdp")
