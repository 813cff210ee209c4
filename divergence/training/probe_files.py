"""The function-space probe over two arms' weights files: what ``divergence watch`` evaluates for a
pair the built-in trainer trains (``pair.yaml`` present, ``tracking.probe.enabled``).

The comparator (``divergence.comparator``) imports nothing from the trainer; the command
(``divergence watch``) hands it ``FileProbe`` as its probe factory. The arms' models are built
from the pair's recipe and evaluated on the same probe set as the lockstep tracker's
(``divergence.training.probe.FunctionProbe``), at the same steps (``probe_due``).
"""

from __future__ import annotations

from divergence.config.schema import parse
from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.layout import ARMS
from divergence.recipe.run import RunRecipe


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
        self._arms = {
            arm: Arm(recipes[arm], inputs.tokenizer, name=f"{self.pair.name}.{arm}").to(device) for arm in ARMS
        }
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
        state = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise UserInputError(f"{path}: does not fit the pair's {prefix.rstrip('.')} ({str(err)[:200]})") from None
