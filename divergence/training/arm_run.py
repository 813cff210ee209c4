"""``divergence train --arm a|b``: one arm of a pair trained as its own (multi-GPU) job.

Real studies outgrow one process: each arm alone may need several GPUs or nodes, and the two
arms run as separate jobs (any Lightning strategy: DDP, FSDP, several nodes, SLURM). Inputs
are a pure function of (data seed, global step, rank), so two separate arms see what a
lockstep pair sees; a comparator (``divergence watch DIR``) follows both and writes the same
metrics store the lockstep tracker writes. Layout of ``DIR`` (the lockstep layout, with each
arm's own training state under its folder)::

    pair.yaml, pair.json                     written by the first arm to start
    metrics.jsonl, wandb/, csv/            the comparator's (the lockstep tracker's in lockstep mode)
    <arm>/checkpoints/step_NNNNNN.safetensors   at every step the tracker compares
    <arm>/losses.jsonl                       the loss of every step (divergence.store.losses)
    <arm>/status.json                        running / finished / failed (divergence.store.arm_status)
    <arm>/resume/last.ckpt                   the arm's full training state; the same command resumes
    <arm>/samples/, <arm>/csv/, <arm>/wandb/ the arm's samples and logs

On one CPU process, an arm here computes bitwise what it computes in lockstep: same weights
files byte for byte, same losses, hence the same store.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from divergence.atomic import write_atomic
from divergence.errors import TrainingDiverged, UserInputError
from divergence.recipe.pair import ARMS, PairRecipe
from divergence.recipe.yaml_safe import read_yaml
from divergence.store.arm_status import ArmStatus
from divergence.store.losses import LossFile
from divergence.pairfolder.pair_json import FILENAME as PAIR_INFO_FILE
from divergence.training.module import DiffusionRun, check_step
from divergence.training.pair import check_shared_inputs, pair_config
from divergence.training.pair_run import PAIR_FILE, added_later, pair_info
from divergence.training.run import check_resume, flatten_keys, global_rank_zero, writable_folder

# Keys of pair.yaml that may differ between the jobs of one pair folder: how each job runs,
# not what it computes. Different world sizes are refused separately (they change the batches).
PER_JOB_KEYS = ("train.accelerator", "train.devices", "train.num_nodes", "train.strategy", "train.cpu_threads",
                "data.workers", "log.")


class ArmRun(DiffusionRun):
    """One arm of a pair recipe as a single run: its variants verified, its last step's output kept."""

    def __init__(self, pair: PairRecipe, arm: str):
        check_shared_inputs(pair)
        super().__init__(pair.arm_recipes[arm])  # named "<pair>.<arm>", as in lockstep
        self.variants = pair.arms[arm]
        self.tensor_order = list(self.arm.weights())  # before any strategy wraps the module
        self.last_output = None

    def configure_optimizers(self):
        counter = super().configure_optimizers()
        for variant in self.variants:
            variant.verify(self.arm)
        return counter

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        check_step(batch, self.global_step)
        out = self.last_output = self.arm.training_step(self.inputs.prepare(batch), backward=self.manual_backward)
        self.optimizers().step()  # one tick of global_step (see StepCounter)
        self.log("train/loss", out.loss, prog_bar=True)
        self.log_dict({"train/grad_norm": out.grad_norm, "train/lr": out.lr, "train/loss_scale": out.loss_scale})
        return out.loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # after the callbacks wrote this step's loss and weights: nothing measured is lost
        bad = not torch.isfinite(self.last_output.loss) and self.arm.policy.name != "16-mixed"
        if self.trainer.strategy.reduce_boolean_decision(bad, all=False):
            raise TrainingDiverged(
                f"arm {self.arm.name}: loss is {float(self.last_output.loss)} at step {self.global_step} "
                "(in losses.jsonl); lower train.lr, set train.grad_clip, or train in 16-mixed with loss scaling"
            )


def train_arm(pair: PairRecipe, arm: str, out: str | Path, callbacks: list | tuple = ()):
    """Train (or resume) arm ``arm`` of ``pair`` in ``out/<arm>``; returns the finished Trainer."""
    from divergence.training.callbacks.arm_progress import ArmProgress
    from divergence.training.callbacks.tracked_weights import TrackedWeights
    from divergence.training.run import fit

    if arm not in ARMS:
        raise UserInputError(f"--arm {arm!r}: must be one of {', '.join(ARMS)}")
    out = Path(out)
    recipe = pair.arm_recipes[arm]
    check_arm_folder(out, pair, arm)
    module = ArmRun(pair, arm)  # builds the arm: bad variants fail before any file is written
    _write_pair_files(out, pair)
    folder = out / arm
    first = [TrackedWeights(folder, pair.tracking, recipe.train.checkpoint_every), ArmProgress(folder, arm)]
    from divergence.training.loggers import RunIdentity

    identity = RunIdentity.for_pair(pair, out, job_type="arm", arm=arm)
    return fit(module, recipe, folder, first_callbacks=first, callbacks=callbacks, identity=identity)


def check_arm_folder(out: Path, pair: PairRecipe, arm: str) -> None:
    """The folder holds nothing, or this pair's separate-job run; the other arm trains alike."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder")
    if (out / "resume").is_dir():
        raise UserInputError(f"--out {out}: holds a lockstep pair run; train separate arms in a new --out")
    if (out / "recipe.yaml").is_file():
        raise UserInputError(f"--out {out}: holds a single run, not a pair; choose a new --out")
    check_resume(out / arm)
    LossFile(out / arm).check()  # a resumed arm cuts it: every line of it must read first
    train = pair.arm_recipes[arm].train
    if train.strategy.startswith("fsdp"):
        _check_fsdp(pair.arm_recipes[arm])
    _check_same_pair(out, pair)
    other = ArmStatus.read(out / ARMS[1 - ARMS.index(arm)])
    world_size = train.devices * train.num_nodes
    if other is not None and other.world_size != world_size:
        raise UserInputError(
            f"arm {arm}: {world_size} ranks (train.devices x train.num_nodes), but the other arm trains on "
            f"{other.world_size}; both arms need the same world size, or their batches differ")


def _check_fsdp(recipe) -> None:
    """What the arm cannot do on sharded weights yet: fail now, with the fix, not after hours."""
    if recipe.train.accelerator == "cpu":
        raise UserInputError("train.strategy=fsdp needs GPUs (Lightning's FSDP); use train.strategy=ddp on CPUs")
    if recipe.sample.enabled:
        raise UserInputError("train.strategy=fsdp: sampling does not run on sharded weights; add sample.enabled=false")
    if recipe.train.grad_clip is not None:
        raise UserInputError("train.strategy=fsdp: the arm would clip by the norm of its own shard, not the global "
                             "norm; add train.grad_clip=null (or train with train.strategy=ddp)")


def _check_same_pair(out: Path, pair: PairRecipe) -> None:
    saved_path = out / PAIR_FILE
    if not saved_path.is_file():
        return
    saved, now = flatten_keys(read_yaml(saved_path) or {}), flatten_keys(pair_config(pair))
    for key in sorted(set(saved) | set(now)):
        per_job = key.split(".", 2)[-1].startswith(PER_JOB_KEYS)
        if saved.get(key) != now.get(key) and not per_job and not added_later(saved, key):
            raise UserInputError(
                f"--out {out}: its {PAIR_FILE} has {key} = {saved.get(key)!r}, this command {now.get(key)!r}; "
                "both arms and the comparator of a folder must train the same pair")


def _write_pair_files(out: Path, pair: PairRecipe) -> None:
    """pair.yaml and pair.json, by whichever arm starts first (atomic: the arms may race), and
    the arm's folder; on global rank zero."""
    if not global_rank_zero():
        return
    writable_folder(out)
    config = pair_config(pair)
    if not (out / PAIR_FILE).is_file():
        write_atomic(out / PAIR_FILE, yaml.safe_dump(config, sort_keys=False))
    if not (out / PAIR_INFO_FILE).is_file():
        pair_info(pair).write(out)
