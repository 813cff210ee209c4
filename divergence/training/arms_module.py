"""The one LightningModule of the built-in trainer: arms ``{name: Arm}`` stepping on one ``Inputs``.

A single run is one arm (``{"run": Arm}``), a lockstep pair two (``{"a": .., "b": ..}``), one arm
of a separate-job pair one (``{"a": Arm}`` or ``{"b": Arm}``). At every step the batch (images,
captions, noise, timesteps) is prepared once, in fp32 and outside any autocast, and every arm
trains on it with its own optimizer, LR schedule, precision policy and attention. Nothing an arm
computes reads a global RNG, so each arm computes bitwise what it would alone: a pair's divergence
is the variants' doing, not the harness's (``recipes/pairs/control.yaml`` checks it).

Manual optimization: each arm does forward and backward (through ``manual_backward``) of each of
the step's ``train.accumulate`` micro-batches, then unscaling, clipping and its optimizer, LR and
EMA steps itself; the module then ticks one ``StepCounter`` so Lightning's ``global_step`` counts
optimizer steps. Under DDP every micro-batch's backward all-reduces (no ``no_sync``): the sum of
rank-averaged micro-gradients is the average of the sums, so the step is the same, at k
all-reduces a step. The DataLoader serves ``StepBatch(step)`` from the
restored ``global_step`` on, and every batch is checked against it: a resumed run sees exactly the
inputs an uninterrupted one saw.

Ranks. ``step_losses`` holds every arm's loss averaged over all ranks (one all-reduce per step,
the identity on one process): what the loggers, ``losses.jsonl`` and the spike detectors get, so
every rank holds the same numbers. The non-finite-loss rule is decided once, after the callbacks
stored the step, and reduced across ranks, so every rank stops together with ``TrainingDiverged``
(one line, no traceback) unless an arm's fp16 loss scaler absorbs the step by skipping it.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from divergence.data.batches import StepBatch
from divergence.lightning.tracker import mean_over_ranks
from divergence.pairfolder.layout import ARMS
from divergence.recipe.run import RunRecipe
from divergence.training.arm import Arm, StepOutput
from divergence.training.inputs import Inputs
from divergence.tracking.recorder import diverged, first_nonfinite
from divergence.training.optim import StepCounter
from divergence.training.step_costs import measures_memory, step_cost

STATE_KEY = "divergence"
LOSS_SCALED = "16-mixed"  # the precision whose loss scaler skips a step with non-finite gradients


class ArmsModule(L.LightningModule):
    """Arms trained in lockstep on the identical inputs, each with its own optimizer and precision.

    ``recipes``: ``{name: RunRecipe}`` (they must agree on what decides the inputs: the first
    one's data, noise and batch size feed every arm); ``folders``: ``{name: prefix}``, where the
    arm's files go below the run folder (``""``: the folder itself); ``labels``: ``{name: label}``
    names in weights files and logs; ``config``: the resolved recipe(s), saved in the .ckpt and the
    loggers' config under ``config_key``; ``variants``: ``{name: (Variant, ...)}`` to verify after
    the optimizers exist; ``recorders``: ``{name: ShadowRecorder or None}``.
    """

    def __init__(
        self,
        recipes: dict[str, RunRecipe],
        *,
        folders: dict[str, str],
        labels: dict[str, str],
        config: dict,
        config_key: str = "recipe",
        variants: dict | None = None,
        recorders: dict | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.recipes, self.folders, self.config, self.config_key = recipes, folders, config, config_key
        self.variants, self.recorders = variants or {}, recorders or {}
        self.save_hyperparameters(config)  # to every logger's config and into the .ckpt
        first = next(iter(recipes.values()))
        self.inputs = Inputs(first)
        # arms on another data seed (the data-seed variant): their own batches of the same data
        self.own_inputs = {n: Inputs(r) for n, r in recipes.items() if r.data.seed != first.data.seed}
        self.workers = first.data.workers
        self.arms = torch.nn.ModuleDict(
            {
                name: Arm(recipe, self.inputs.tokenizer, name=labels[name], recorder=self.recorders.get(name))
                for name, recipe in recipes.items()
            }
        )
        self.tensor_order = {name: list(arm.weights()) for name, arm in self.arms.items()}  # before any wrapping
        self.last_outputs: dict[str, StepOutput] | None = None  # this rank's
        self.last_costs: dict[str, dict] = {}  # this rank's: {arm: {"seconds", "peak_bytes"}} of the last step
        self.step_losses: dict[str, float] | None = None  # averaged over ranks

    def checkpoint_arms(self) -> dict[str, Arm]:
        """Arms by folder prefix (weights go to ``<out>/<prefix>/checkpoints``)."""
        return {self.folders[name]: arm for name, arm in self.arms.items()}

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device
        for arm in self.arms.values():
            arm.setup(device)
        self.inputs.to(device)
        for inputs in self.own_inputs.values():
            inputs.to(device)

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy`` (``divergence.training.tensor_parallel``), once: each arm's
        DiT blocks sharded over the tensor-parallel mesh (``train.tensor_parallel``), its trained
        networks fully sharded over the data-parallel mesh (FSDP2, ``train.fsdp_sharding``), or its
        MoE experts over the data-parallel mesh (``train.expert_parallel``,
        ``divergence.models.expert_parallel``)."""
        mesh = self.device_mesh  # set by ModelParallelStrategy before this hook, else None
        if mesh is None or getattr(self, "_model_parallel_done", False):
            return
        from divergence.models import fully_sharded
        from divergence.models.expert_parallel import shard_experts
        from divergence.models.tensor_parallel import parallelize

        for arm in self.arms.values():
            train = arm.recipe.train
            if train.tensor_parallel > 1:
                parallelize(arm.unet, mesh["tensor_parallel"])
            if train.fsdp_sharding is not None:
                for network in arm.trained_networks():
                    fully_sharded.shard(network, mesh["data_parallel"], train.fsdp_sharding)
            if train.expert_parallel > 1:
                shard_experts(arm.unet, mesh["data_parallel"])
        self._model_parallel_done = True

    def configure_optimizers(self):
        for name, arm in self.arms.items():
            arm.configure_optimizers()
            for variant in self.variants.get(name, ()):
                variant.verify(arm)
        return StepCounter()

    def train_dataloader(self) -> DataLoader:
        """Batches of steps ``global_step, global_step + 1, ...`` (Lightning calls it after restoring a
        checkpoint, so a resumed run starts at the right step); a tensor-parallel group reads one replica's."""
        from divergence.training.tensor_parallel import data_parallel

        stream = self.inputs.stream(self.trainer.global_step, *data_parallel(self.trainer))
        return DataLoader(stream, batch_size=None, num_workers=self.workers, persistent_workers=self.workers > 0)

    def transfer_batch_to_device(self, batch: StepBatch, device: torch.device, dataloader_idx: int) -> StepBatch:
        return batch.to(device)

    def training_step(self, batch: StepBatch, batch_idx: int) -> torch.Tensor:
        if batch.step != self.global_step:  # the batch of another step: a resume or loader bug
            raise RuntimeError(f"data loader served the batch of step {batch.step} at global step {self.global_step}")
        shared = self.inputs.prepare_step(batch)  # once, for every arm: the step's micro-batches
        self.last_outputs, self.last_costs = {}, {}
        for name, arm in self.arms.items():  # each arm's step timed and its peak memory read (costs.jsonl)
            own = self.own_inputs.get(name)  # an arm's own data seed (the data-seed variant): this rank's batch
            rank, world = self.trainer.global_rank, self.trainer.world_size
            micro = (
                shared if own is None else own.prepare_step(own.batches.batch(batch.step, rank, world).to(self.device))
            )
            mine = micro[0] if len(micro) == 1 else micro
            with step_cost(self.device, memory=measures_memory(batch.step)) as self.last_costs[name]:
                self.last_outputs[name] = arm.training_step(mine, backward=self.manual_backward)
        self.optimizers().step()  # one tick of global_step (see StepCounter)
        self.step_losses = mean_over_ranks(self.trainer, {n: out.loss for n, out in self.last_outputs.items()})
        self._log_step()
        return next(iter(self.last_outputs.values())).loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # after the callbacks stored this step's loss, records and weights: nothing measured is lost
        scaled = tuple(name for name, arm in self.arms.items() if arm.policy.name == LOSS_SCALED)
        bad = first_nonfinite(self.step_losses, exempt=scaled)
        if self.trainer.strategy.reduce_boolean_decision(bad is not None, all=False):
            name = bad if bad is not None else next(iter(self.step_losses))
            what = f"arm {name}" if len(self.arms) > 1 or name in ARMS else f"run {self.arms[name].name}"
            raise diverged(
                what,
                self.step_losses[name],
                self.global_step,
                "",
                "lower train.lr, set train.grad_clip, or train in 16-mixed with loss scaling",
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[STATE_KEY] = {
            self.config_key: self.config,
            "arms": {self.folders[name]: arm.train_state_dict() for name, arm in self.arms.items()},
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint[STATE_KEY]["arms"]
        for name, arm in self.arms.items():
            arm.load_train_state_dict(saved[self.folders[name]])

    def _log_step(self) -> None:
        if len(self.arms) == 1:  # a single run or a separate arm: its own train/* series
            ((name, out),) = self.last_outputs.items()
            self.log("train/loss", self.step_losses[name], prog_bar=True)
            self.log_dict({"train/grad_norm": out.grad_norm, "train/lr": out.lr, "train/loss_scale": out.loss_scale})
        else:  # a pair: the tracker logs train/loss_<arm>; the progress bar shows them too
            self.log_dict(
                {f"loss_{name}": loss for name, loss in self.step_losses.items()}, prog_bar=True, logger=False
            )
