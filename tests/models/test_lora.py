"""LoRA training (model.lora): only adapters train, the store sees each layer's effective change
(alpha/r) B A as ``<module>.lora_delta``, equal to peft's own merge, and a control is zero."""

import pytest
import torch

from divergence.checkpoints.compare import compare_state_dicts
from divergence.errors import RecipeError
from tests.training.tiny import ready_arm, tiny_recipe

LORA = "model.lora={rank: 2, alpha: 4, targets: [to_q, to_k, to_v, to_out.0, add_q_proj, to_add_out]}"
BACKBONES = {
    "unet": (),
    "sd3": ("model.denoiser=transformer", "model.transformer.kind=sd3"),
}


def _arm(backbone, *overrides):
    return ready_arm(*BACKBONES[backbone], "model.text_encoder.train=false", *overrides)


def _merged_minus_base(arm) -> dict[str, torch.Tensor]:
    """By hand: each LoRA layer's weight after peft merges the adapter, minus its base weight."""
    out = {}
    for name, module in arm.unet.named_modules():
        if hasattr(module, "merge") and hasattr(module, "base_layer"):
            base = module.base_layer.weight.detach().clone()
            module.merge()
            out[f"unet.{name}.lora_delta"] = module.base_layer.weight.detach() - base
            module.unmerge()
    return out


@pytest.mark.parametrize("backbone", BACKBONES)
def test_tracked_weights_are_the_effective_changes(backbone):
    arm, inputs = _arm(backbone, LORA)
    step0 = arm.weights()
    deltas = {k for k in step0 if k.endswith(".lora_delta")}
    assert deltas and all(not step0[k].any() for k in deltas)  # B starts at zero: step 0 is the base model
    assert not any(".lora_A" in k or ".lora_B" in k or "base_layer" in k for k in step0)
    frozen = {n: p.detach().clone() for n, p in arm.unet.named_parameters() if "lora_" not in n}
    for step in range(2):
        arm.training_step(inputs.prepare(inputs.batches.batch(step)))
    assert all(torch.equal(p, frozen[n]) for n, p in arm.unet.named_parameters() if "lora_" not in n)
    tracked, by_hand = arm.weights(), _merged_minus_base(arm)
    assert set(by_hand) == deltas
    # the last SD3 block is context_pre_only: its caption queries feed nothing, so no gradient
    unused = {k for k in deltas if backbone == "sd3" and ".transformer_blocks.1.attn.add_q_proj" in k}
    assert all((tracked[k].abs().max() > 0) != (k in unused) for k in deltas)
    for name in deltas:
        torch.testing.assert_close(tracked[name], by_hand[name], rtol=1e-4, atol=1e-6)
    if backbone == "sd3":
        assert any(".add_q_proj.lora_delta" in k for k in deltas) and any(".to_add_out.lora_delta" in k for k in deltas)


def test_lora_control_pair_is_exactly_zero():
    (a, inputs), (b, _) = _arm("sd3", LORA), _arm("sd3", LORA)
    for step in range(2):
        batch = inputs.prepare(inputs.batches.batch(step))
        a.training_step(batch), b.training_step(batch)
    summary = compare_state_dicts(a.weights(), b.weights()).summary
    assert summary["max_abs_diff"] == 0.0 and summary["tensors"] > 0


def test_lora_init_follows_model_seed():
    a, _ = _arm("unet", LORA)
    b, _ = _arm("unet", LORA, "model.seed=0")
    c, _ = _arm("unet", LORA, "model.seed=1")
    factors = lambda arm: {n: p for n, p in arm.unet.named_parameters() if "lora_A" in n}  # noqa: E731
    assert all(torch.equal(x, y) for x, y in zip(factors(a).values(), factors(b).values()))
    assert not torch.equal(next(iter(factors(a).values())), next(iter(factors(c).values())))


@pytest.mark.parametrize(
    "override, match",
    [
        ("model.lora={rank: 0}", "model.lora.rank"),
        ("model.lora={alpha: -1}", "model.lora.alpha"),
        ("model.lora={targets: []}", "model.lora.targets"),
    ],
)
def test_bad_lora_recipes_name_the_key(override, match):
    with pytest.raises(RecipeError, match=match):
        tiny_recipe(override)


def test_targets_that_match_nothing_name_the_key():
    with pytest.raises(RecipeError, match="model.lora.targets"):
        _arm("unet", "model.lora={targets: [no_such_layer]}")


def test_store_records_of_a_lora_pair_are_per_effective_change(tmp_path):
    from divergence.training.lockstep import train_pair
    from tests.pairs.helpers import pair_recipe, step_records, store_lines

    train_pair(pair_recipe("control", "train.max_steps=2", "tracking.every=1", *BACKBONES["sd3"], LORA), tmp_path)
    assert all(r["max_abs_diff"] == 0.0 for r in step_records(tmp_path).values())
    names = {r["tensor"] for r in store_lines(tmp_path) if r["type"] == "tensor"}
    lora = {n for n in names if n.startswith("unet.")}
    assert lora and all(n.endswith(".lora_delta") for n in lora)
