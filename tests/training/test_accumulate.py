"""Gradient accumulation: k micro-batches of b examples make the step one batch of k b makes."""

import pytest
import torch

from divergence.errors import RecipeError
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from tests.training.tiny import tiny_recipe

CPU = torch.device("cpu")


def _train(recipe, steps: int):
    inputs = Inputs(recipe)
    arm = Arm(recipe, inputs.tokenizer)
    arm.setup(CPU)
    arm.configure_optimizers()
    outs = [arm.training_step(inputs.prepare_step(inputs.batches.batch(s))) for s in range(steps)]
    return arm, outs


def _rel_l2(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """``||a - b|| / ||a||`` over all tensors together."""
    diff = sum(float(((x - y).double() ** 2).sum()) for x, y in zip(a, b))
    return (diff / sum(float((x.double() ** 2).sum()) for x in a)) ** 0.5


@pytest.mark.parametrize("clip", ["1.0", "null"])
def test_k_micro_batches_equal_one_batch_k_times_larger(clip):
    """Same examples and draws (the global batch depends on the step only); the mean of the
    micro-batch means is the batch mean, and the summed gradients of loss_m / k are the batch
    mean's gradient. Not bitwise: the batch's reductions sum in another order (per micro-batch,
    then across), so gradients agree to fp32 rounding (relative L2 ~1e-6 seen), and a weight whose
    gradient is ~0 (rounding noise) may move by up to lr either way under AdamW's g / sqrt(v); so
    the updates are compared as a whole (relative L2 ~5e-6 seen), with 10x to 20x margin."""
    common = ("train.lr=0.001", f"train.grad_clip={clip}")
    init = [w.clone() for w in _train(tiny_recipe("train.batch_size=4", *common), 0)[0].weights().values()]
    big, big_out = _train(tiny_recipe("train.batch_size=4", *common), 3)
    acc, acc_out = _train(tiny_recipe("train.batch_size=2", "train.accumulate=2", *common), 3)
    for b, a in zip(big_out, acc_out):
        assert torch.allclose(b.loss, a.loss, rtol=1e-5, atol=0)
        assert torch.allclose(b.grad_norm, a.grad_norm, rtol=1e-5, atol=0)
        assert b.lr == a.lr
    grads = [
        (p.grad, q.grad) for p, q in zip(big.trainable_parameters(), acc.trainable_parameters()) if p.grad is not None
    ]
    assert 0 < _rel_l2(*zip(*grads)) < 2e-5  # the last step's gradients
    updates = [(wb - w0, wa - w0) for w0, wb, wa in zip(init, big.weights().values(), acc.weights().values())]
    assert 0 < _rel_l2(*zip(*updates)) < 1e-4


def _plain_steps(recipe, steps: int):
    """The textbook step, written out: the whole batch, forward, MSE, backward, clip, AdamW, LR."""
    inputs = Inputs(recipe)
    arm = Arm(recipe, inputs.tokenizer)
    arm.setup(CPU)
    arm.configure_optimizers()
    losses = []
    for s in range(steps):
        x = inputs.prepare(inputs.batches.batch(s))  # no micro-batch split
        arm.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(arm.predict(x).float(), x.target.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(arm.trainable_parameters(), recipe.train.grad_clip)
        arm.optimizer.step()
        arm.lr_scheduler.step()
        losses.append(loss.detach())
    return arm, losses


def test_one_micro_batch_is_the_plain_step_bitwise():
    """accumulate=1 (the default) takes no detour: no loss / 1, no micro-batch split, no
    stacking of one loss; its losses and weights are the textbook step's bit for bit."""
    recipe = tiny_recipe("train.accumulate=1", "train.grad_clip=1.0")
    assert recipe.train.accumulate == 1 and recipe.train.grad_noise is None and recipe.train.ema is None
    plain, plain_losses = _plain_steps(recipe, 2)
    ours, ours_out = _train(recipe, 2)
    assert all(torch.equal(a, b.loss) for a, b in zip(plain_losses, ours_out))
    assert all(torch.equal(v, ours.weights()[k]) for k, v in plain.weights().items())


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "true"])
def test_bad_accumulate_is_refused(value):
    with pytest.raises(RecipeError, match="train.accumulate"):
        tiny_recipe(f"train.accumulate={value}")
