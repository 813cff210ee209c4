"""The tiny recipe shrunk further for tests: two examples a batch, quick samples, no wandb."""

import pytest
import torch

from divergence.recipe.run import RunRecipe
from divergence.config.schema import apply_overrides, parse

FAST = (
    "train.batch_size=2",
    "sample.steps=2",
    "sample.per_prompt=1",
    "sample.prompts=[a red circle, a blue square]",
    "log.wandb=false",
    "log.progress_bar=false",
    "train.accelerator=cpu",
)
# The tiny DiT (recipes/tiny-dit.yaml's denoiser) in place of the UNet: a step about 3x cheaper, for
# tests of a mechanism the denoiser does not change (the UNet keeps one test of each property)
DIT = ("model.denoiser=transformer",)


def tiny_recipe(*overrides: str) -> RunRecipe:
    return parse(RunRecipe, apply_overrides({}, [*FAST, *overrides]))


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; on a shared 2-core machine, far faster (each pytest
    process starts on one: tests/conftest.py); after a test that sets another count, one again."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ready_arm(*overrides: str, recorder=None):
    """``(Arm, Inputs)`` of ``tiny_recipe(*overrides)``, set up on the CPU with its optimizer built."""
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs

    recipe = tiny_recipe(*overrides)
    inputs = Inputs(recipe)
    arm = Arm(recipe, inputs.tokenizer, recorder=recorder)
    arm.setup(torch.device("cpu"))
    arm.configure_optimizers()
    return arm, inputs
