"""The mixture-of-experts backbone (model.moe): routing and capacity as the formulas say, both expert
computations equal to a token-by-token oracle, the recipe section validated, a control pair exactly
zero and a resumed run bitwise the uninterrupted one."""

import math

import pytest
import torch
import torch.nn.functional as F

from divergence.errors import RecipeError
from divergence.models.moe import MoEFeedForward, balance_loss, capacity, moe_layers, route
from divergence.recipe.model import MoEConfig
from divergence.training.lockstep import train_pair
from divergence.training.single import train_run
from tests.pairs.helpers import pair_recipe, step_records
from tests.training.test_train import Crash, _assert_bitwise_equal
from tests.training.tiny import ready_arm, tiny_recipe

MOE = ("model.denoiser=transformer", "model.moe={}")


def test_capacity_drops_exactly_the_choices_past_each_experts_queue():
    # 6 tokens, 3 experts, top-2, capacity 2 per expert. First choices: 0,0,0,1,1,2;
    # second choices: 1,2,1,2,2,0. Queues fill slot by slot: expert 0 takes t0, t1, then drops
    # t2 and t5's 2nd; expert 1 takes t3, t4, then drops t0's and t2's 2nd; expert 2 takes t5
    # and t1's 2nd, then drops t3's and t4's 2nd. 6 of 12 choices dropped.
    first, second = [0, 0, 0, 1, 1, 2], [1, 2, 1, 2, 2, 0]
    probs = torch.full((6, 3), 0.1)
    for t, (e1, e2) in enumerate(zip(first, second)):
        probs[t, e1], probs[t, e2] = 0.6, 0.3
    experts, position, kept = route(probs, 2, 2)
    assert experts.tolist() == [list(p) for p in zip(first, second)]
    assert kept.tolist() == [[True, False], [True, True], [False, False], [True, False], [True, False], [True, False]]
    assert int((~kept).sum()) == 6
    assert position[:, 0].tolist() == [0, 1, 2, 0, 1, 0] and position[1, 1] == 1


def test_capacity_formula_and_no_limit():
    assert capacity(512, 2, 4, 1.25) == 320 and capacity(10, 1, 4, 1.0) == 3
    assert capacity(512, 2, 4, None) == 512


def test_balance_loss_is_one_when_uniform_and_grows_with_imbalance():
    probs = torch.full((8, 4), 0.25)
    uniform = torch.arange(8).remainder(4)[:, None]
    assert balance_loss(probs, uniform) == pytest.approx(1.0)
    skewed = torch.softmax(torch.tensor([[4.0, 0, 0, 0]]).expand(8, 4), -1)
    assert balance_loss(skewed, torch.zeros(8, 1, dtype=torch.long)) > 3.0


def test_micro_batches_drop_and_balance_otherwise_than_one_batch():
    # Why 4x4 accumulation is no reordering of an MoE (so the MoE study's reordering yardstick is
    # fused vs loop AdamW, recipes/pairs/reordering-adamw.yaml): capacity and the balance loss are
    # per forward pass. The same 64 tokens in one pass, or in 4 passes of 16 with a quarter of the
    # capacity each, keep other choices, and the mean of 4 balance losses is not the whole batch's.
    torch.manual_seed(0)
    probs = torch.softmax(2 * torch.randn(64, 4), -1)
    experts, _, whole = route(probs, 2, capacity(64, 2, 4, 1.25))
    parts = torch.cat([route(p, 2, capacity(16, 2, 4, 1.25))[2] for p in probs.chunk(4)])
    assert not torch.equal(whole, parts)
    chunks = [balance_loss(p, e) for p, e in zip(probs.chunk(4), experts.chunk(4))]
    assert abs(float(torch.stack(chunks).mean()) - float(balance_loss(probs, experts))) > 1e-3


def _oracle(layer: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token: y_t = sum over kept slots of g_ts expert_s(x_t), gates renormalised."""
    tokens = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(tokens @ layer.router.weight.t(), -1)
    slots = capacity(tokens.shape[0], layer.config.top_k, layer.config.experts, layer.config.capacity_factor)
    experts, _, kept = route(probs, layer.config.top_k, slots)
    out = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        gates = probs[t, experts[t]] / probs[t, experts[t]].sum()
        for s, e in enumerate(experts[t].tolist()):
            if kept[t, s]:
                h = F.gelu(tokens[t] @ layer.w1[e] + layer.b1[e], approximate="tanh")
                out[t] += gates[s] * (h @ layer.w2[e] + layer.b2[e])
    return out.reshape(x.shape)


@pytest.mark.parametrize("compute", ["grouped", "loop"])
def test_each_expert_computation_is_the_token_by_token_formula(compute):
    torch.manual_seed(0)
    layer = MoEFeedForward(8, 12, MoEConfig(experts=4, top_k=2, capacity_factor=0.75, expert_compute=compute))
    x = torch.randn(2, 10, 8)
    with torch.no_grad():
        got, expected = layer(x), _oracle(layer, x)
    assert (~layer.routing.kept).any()  # capacity 0.75: some choices dropped
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_recipe_section_is_validated_and_names_the_key():
    assert tiny_recipe(*MOE).model.moe == MoEConfig()
    with pytest.raises(RecipeError, match="model.moe.top_k: must be between 1 and experts"):
        tiny_recipe(*MOE, "model.moe.top_k=5")
    with pytest.raises(RecipeError, match="unknown key 'model.moe.expert'"):
        tiny_recipe(*MOE, "model.moe.expert=3")
    with pytest.raises(RecipeError, match="model.moe: replaces a transformer's MLPs"):
        tiny_recipe("model.moe={}")
    with pytest.raises(RecipeError, match="model.moe.capacity_factor: must be > 0"):
        tiny_recipe(*MOE, "model.moe.capacity_factor=0")


def test_every_block_has_experts_that_train_with_the_balance_loss():
    arm, inputs = ready_arm(*MOE)
    layers = moe_layers(arm.unet)
    assert len(layers) == 2 and all(layer.w1.shape == (4, 64, 128) for layer in layers.values())
    before = {name: layer.router.weight.detach().clone() for name, layer in layers.items()}
    out = arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    assert math.isfinite(float(out.loss))
    for name, layer in layers.items():
        assert not torch.equal(before[name], layer.router.weight), name
        assert (
            layer.aux_loss is not None and float(layer.aux_loss.detach()) >= 1.0 - 1e-6
        )  # E sum f P >= 1 (Cauchy-Schwarz)
        assert layer.routing.experts.shape == (2 * 256, 2)
    # the balance loss is in the gradient: without it the router learns something else
    plain, inputs = ready_arm(*MOE, "model.moe.balance_loss=0")
    plain.training_step(inputs.prepare(inputs.batches.batch(0)))
    name = next(iter(layers))
    assert not torch.equal(moe_layers(plain.unet)[name].router.weight, layers[name].router.weight)


def test_moe_control_pair_is_exactly_zero(tmp_path):
    train_pair(pair_recipe("control", *MOE, "train.max_steps=3", "tracking.every=1"), tmp_path)
    steps = step_records(tmp_path)
    assert sorted(steps) == [0, 1, 2, 3]
    for step, record in steps.items():
        assert record["max_abs_diff"] == 0.0 and record["wasserstein"] == 0.0, step
        if step:
            assert record["loss_a"] == record["loss_b"]


def test_moe_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path):
    recipe = tiny_recipe(*MOE, "train.max_steps=4", "train.checkpoint_every=2", "sample.enabled=false", "log.csv=false")
    train_run(recipe, tmp_path / "straight")
    with pytest.raises(SystemError, match="simulated crash"):
        train_run(recipe, tmp_path / "resumed", callbacks=[Crash(3)])  # last.ckpt holds step 2
    train_run(recipe, tmp_path / "resumed")
    name = "checkpoints/step_000004.safetensors"
    _assert_bitwise_equal(tmp_path / "straight" / name, tmp_path / "resumed" / name)


def test_the_shipped_recipe_is_the_tiny_dit_with_experts():
    from pathlib import Path

    from divergence.recipe.run import load_run_recipe

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    moe, dit = load_run_recipe(recipes / "tiny-moe.yaml"), load_run_recipe(recipes / "tiny-dit.yaml")
    assert moe.model.moe == MoEConfig(experts=4, top_k=2, capacity_factor=1.25)
    assert moe.model.transformer == dit.model.transformer and moe.train == dit.train
