"""The LightningModule of a pair: two arms trained in lockstep on the identical inputs.

At every step the batch (images, captions, noise, timesteps) is prepared once, in fp32 and
outside any autocast, and both arms train on it, each with its own optimizer, LR schedule,
precision policy (autocast and loss scaler) and attention implementation. Nothing an arm
computes reads a global RNG, so each arm computes bitwise what it would alone: the pair's
divergence is the variants' doing, not the harness's (``recipes/pairs/control.yaml`` checks
that: two identical arms stay exactly equal).
"""

from __future__ import annotations

import lightning as L
import torch

from divergence.data.batches import StepBatch
from divergence.errors import RecipeError
from divergence.recipe.pair import ARMS, PairRecipe
from divergence.recipe.schema import to_dict
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.module import STATE_KEY, check_step, step_dataloader
from divergence.training.optim import StepCounter

# Recipe sections that decide the inputs: both arms must agree on them to share one batch.
SHARED_INPUTS = ("data", "noise", "model.tokenizer", "model.vae", "train.batch_size", "train.max_steps")


class PairRun(L.LightningModule):
    """Arms ``a`` and ``b`` of a pair recipe, stepping together on one ``Inputs``."""

    def __init__(self, pair: PairRecipe):
        super().__init__()
        self.automatic_optimization = False
        self.pair = pair
        check_shared_inputs(pair)
        self.save_hyperparameters(pair_config(pair))
        self.inputs = Inputs(pair.arm_recipes["a"])
        # an arm on the shadow attention variant records its attention-output deviation here
        self.recorders = {arm: shadow_recorder(pair.arm_recipes[arm]) for arm in ARMS}
        self.arms = torch.nn.ModuleDict(
            {arm: Arm(pair.arm_recipes[arm], self.inputs.tokenizer, name=f"{pair.name}.{arm}",
                      recorder=self.recorders[arm]) for arm in ARMS}
        )
        self.last_outputs = None

    def checkpoint_arms(self) -> dict[str, Arm]:
        return dict(self.arms)

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device
        for arm in self.arms.values():
            arm.setup(device)
        self.inputs.to(device)

    def configure_optimizers(self):
        for name, arm in self.arms.items():
            arm.configure_optimizers()
            for variant in self.pair.arms[name]:
                variant.verify(arm)
        return StepCounter()

    def train_dataloader(self):
        return step_dataloader(self.trainer, self.inputs, self.pair.base.data.workers)

    def transfer_batch_to_device(self, batch: StepBatch, device: torch.device, dataloader_idx: int) -> StepBatch:
        return batch.to(device)

    def training_step(self, batch: StepBatch, batch_idx: int):
        check_step(batch, self.global_step)
        inputs = self.inputs.prepare(batch)  # once, for both arms
        self.last_outputs = {name: arm.training_step(inputs, backward=self.manual_backward)
                             for name, arm in self.arms.items()}
        self.optimizers().step()  # one tick of global_step for the pair
        self.log_dict({f"loss_{name}": out.loss for name, out in self.last_outputs.items()},
                      prog_bar=True, logger=False)
        return self.last_outputs["a"].loss

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[STATE_KEY] = {"pair": pair_config(self.pair),
                                 "arms": {name: arm.train_state_dict() for name, arm in self.arms.items()}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint[STATE_KEY]["arms"]
        for name, arm in self.arms.items():
            arm.load_train_state_dict(saved[name])


def shadow_recorder(recipe):
    """A ShadowRecorder for a recipe on the ``shadow`` attention variant, else None."""
    from divergence.models.attention import SHADOW

    if recipe.attention.name != SHADOW:
        return None
    from divergence.attention.shadow import ShadowRecorder

    return ShadowRecorder()


def pair_config(pair: PairRecipe) -> dict:
    """The resolved pair as plain data: name, arms' variants and both arms' recipes."""
    return {"name": pair.name, "category": pair.category, "control": pair.control, "replicate": pair.replicate,
            "arms": pair.labels(), "tracking": to_dict(pair.tracking),
            "recipes": {arm: to_dict(pair.arm_recipes[arm]) for arm in ARMS}}


def check_shared_inputs(pair: PairRecipe) -> None:
    """Both arms must read identical inputs; a variant that changes them breaks the pairing."""
    a, b = (to_dict(pair.arm_recipes[arm]) for arm in ARMS)
    for key in SHARED_INPUTS:
        if _get(a, key) != _get(b, key):
            raise RecipeError(f"arms differ in {key}, which decides the shared inputs; a pair must train on "
                              "identical batches (change it in the base recipe for both arms)")


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data
