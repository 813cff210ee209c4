"""What ``divergence watch`` takes from the built-in trainer: the pair's loggers and the probe.

The comparator (``divergence.comparator``) reads only the pair-folder contract and imports
nothing from ``divergence.training``; these two parts do, and are loaded only when used: the
loggers when ``watch`` logs (not with ``--no-log``), the function-space probe when the pair has
a ``pair.yaml`` with ``tracking.probe.enabled`` (a pair the built-in trainer trains).

The comparator's logs are exactly what the lockstep tracker sends its loggers, for the same steps.

The loggers are the pair's own (``divergence.training.loggers.build_loggers`` on the pair
folder: the user's wandb settings first, one run id in ``DIR/wandb-id`` so a restarted
comparator continues the same wandb run; CSV under ``DIR/csv``), filed as ``job_type``
``comparator`` in the pair's group with the pair's tags, and the keys and tables are
``divergence.tracking.step_logging``'s, shared with the lockstep tracker so the two modes
cannot drift apart. When the pair is complete, the store goes to wandb as an artifact.
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.layout import ARMS
from divergence.recipe.run import RunRecipe
from divergence.pairfolder.settings import LogConfig
from divergence.config.schema import parse


class StepLogger:
    def __init__(self, out: Path, log: LogConfig, name: str, checkpoint_every: int, max_steps: int, hparams: dict):
        from divergence.training.loggers import RunIdentity, build_loggers

        self.loggers = build_loggers(log, out, name, RunIdentity.for_comparator(out, hparams))
        for logger in self.loggers:
            logger.log_hyperparams(hparams)
        self.checkpoint_every, self.max_steps = checkpoint_every, max_steps
        self.complete = False

    def log(self, step: int, record: dict, tensors: list[dict]) -> None:
        from divergence.tracking.step_logging import is_table_step, log_step

        log_step(self.loggers, step, record, tensors, table=is_table_step(step, self.max_steps, self.checkpoint_every))
        self.complete = self.complete or step >= self.max_steps

    def close(self) -> None:
        from divergence.training.loggers import finish_wandb

        for logger in self.loggers:
            logger.finalize("success")
        finish_wandb(self.loggers, artifacts=self.complete)


class FileProbe:
    """The function-space probe over two arms' weights files (built lazily: models, then the probe set)."""

    def __init__(self, pair, device):
        self.pair, self.device = pair, device
        self._arms = self._probe = None

    def due(self, step: int) -> bool:
        """The lockstep tracker's rule (``probe_due``), so both stores hold the same probe steps."""
        from divergence.pairfolder.settings import probe_due

        return probe_due(step, self.pair.max_steps, self.pair.tracking.probe)

    def record(self, paths: dict) -> dict:
        if self._probe is None:
            self._build()
        for arm, model in self._arms.items():
            _load_weights(model, paths[arm])
        return self._probe.record(self._arms["a"], self._arms["b"])

    def _build(self) -> None:
        import torch

        from divergence.recipe.pair import replicate_seed
        from divergence.training.arm import Arm
        from divergence.training.inputs import Inputs
        from divergence.training.probe import FunctionProbe

        recipes = {arm: parse(RunRecipe, self.pair.recipe_config["recipes"][arm], f"recipes.{arm}") for arm in ARMS}
        inputs = Inputs(recipes["a"])
        device = torch.device(self.device)
        self._arms = {arm: Arm(recipes[arm], inputs.tokenizer, name=f"{self.pair.name}.{arm}").to(device)
                      for arm in ARMS}
        inputs.to(device)
        seed = replicate_seed(self.pair.tracking.probe.seed, self.pair.replicate)
        self._probe = FunctionProbe(inputs, self.pair.tracking.probe, seed)


def _load_weights(arm, path: str) -> None:
    """Copy a weights file (``unet.*``, ``text_encoder.*``) into ``arm``'s networks, every key required."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(path, device=str(next(arm.parameters()).device))
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from None
    for prefix, network in (("unet.", arm.unet), ("text_encoder.", arm.text_encoder)):
        state = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise UserInputError(f"{path}: does not fit the pair's {prefix.rstrip('.')} ({str(err)[:200]})") from None
