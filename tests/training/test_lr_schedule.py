"""LR schedules are diffusers' ``get_scheduler``, called as diffusers' training scripts call it."""

import pytest
import torch
from diffusers.optimization import get_scheduler

from divergence.errors import RecipeError
from divergence.recipe.run import LR_SCHEDULES
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.optim import build_lr_schedule
from tests.training.tiny import DIT, tiny_recipe

STEPS, WARMUP = 23, 5


def _lrs(scheduler, optimizer) -> list[float]:
    out = []
    for _ in range(STEPS):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize("name", LR_SCHEDULES)
def test_every_step_equals_get_scheduler_on_a_bare_optimizer(name):
    warmup = 0 if name == "constant" else WARMUP
    recipe = tiny_recipe(
        f"train.lr_schedule={name}",
        f"train.warmup_steps={warmup}",
        f"train.max_steps={STEPS}",
        "train.lr_num_cycles=3",
        "train.lr_power=2.0",
        "train.lr=0.01",
    )
    ours_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    ours = _lrs(build_lr_schedule(ours_opt, recipe.train), ours_opt)
    bare_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    bare = get_scheduler(name, bare_opt, num_warmup_steps=warmup, num_training_steps=STEPS, num_cycles=3, power=2.0)
    assert ours == _lrs(bare, bare_opt)  # exactly, every step
    if warmup:
        assert ours[0] == 0.0 and ours[WARMUP] == pytest.approx(0.01)  # diffusers' warm-up: from 0, full at W


def test_constant_with_a_warmup_is_refused_with_the_fix():
    with pytest.raises(RecipeError, match="train.lr_schedule: constant ignores warmup_steps=10.*constant_with_warmup"):
        tiny_recipe("train.warmup_steps=10")


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.lr_schedule=cosine_restarts", "train.lr_schedule"),
        ("train.lr_num_cycles=0", "train.lr_num_cycles"),
        ("train.lr_power=0", "train.lr_power"),
    ],
)
def test_bad_schedule_keys_name_the_key(override, key):
    with pytest.raises(RecipeError, match=key):
        tiny_recipe(override)


def test_polynomial_needs_lr_above_its_end():
    with pytest.raises(RecipeError, match="train.lr: polynomial decays to 1e-07"):
        tiny_recipe("train.lr_schedule=polynomial", "train.lr=1e-8")


def test_resume_continues_the_schedule_bitwise():
    """On the DiT (a step ~3x cheaper): the schedule is the optimizer's, whatever the denoiser."""
    schedule = ("train.lr_schedule=cosine_with_restarts", "train.warmup_steps=2", "train.lr_num_cycles=2")
    recipe = tiny_recipe(*DIT, *schedule, "train.max_steps=6")
    inputs = Inputs(recipe)
    batches = [inputs.prepare(inputs.batches.batch(s)) for s in range(5)]

    def arm():
        a = Arm(recipe, inputs.tokenizer)
        a.setup(torch.device("cpu"))
        return a

    straight = arm()
    straight.configure_optimizers()
    lrs = [straight.training_step(b).lr for b in batches]
    first = arm()
    first.configure_optimizers()
    for b in batches[:3]:
        first.training_step(b)
    resumed = arm()
    resumed.load_state_dict(first.state_dict())
    resumed.load_train_state_dict(first.train_state_dict())
    resumed.configure_optimizers()
    assert [resumed.training_step(b).lr for b in batches[3:]] == lrs[3:]
    assert all(torch.equal(v, resumed.weights()[k]) for k, v in straight.weights().items())


def test_a_resume_state_of_the_former_own_schedule_loads():
    """Resume files written before: a ``LambdaLR`` of our own factor; the step count carries over."""
    recipe = tiny_recipe("train.max_steps=10")
    old_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    old = torch.optim.lr_scheduler.LambdaLR(old_opt, lambda step: 1.0)
    for _ in range(4):
        old_opt.step()
        old.step()
    new_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    new = build_lr_schedule(new_opt, recipe.train)
    new.load_state_dict(old.state_dict())
    assert new.last_epoch == 4 and new.get_last_lr() == [0.01]
