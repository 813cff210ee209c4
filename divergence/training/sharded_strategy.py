"""Lightning's ``ModelParallelStrategy`` for arms whose weights are DTensors (tensor parallel, FSDP2),
resuming from the one-file checkpoint it writes on rank zero.

The arms step their own optimizers, whose state (AdamW's moments gathered into full tensors) goes
into the checkpoint through ``ArmsModule.on_save_checkpoint``; the only optimizer Lightning holds is
the parameterless ``StepCounter``. Lightning 2.6's loader of a full checkpoint re-keys every
optimizer's state by its first entry, which fails on an optimizer with none (``IndexError``), so a
resume crashed before its first step. This strategy loads the weights as Lightning does (the full
state dict into the sharded module, every rank reading the file) and leaves the optimizers to the
module, which holds their state.
"""

from __future__ import annotations

from pathlib import Path

from lightning.fabric.strategies.model_parallel import _load_checkpoint
from lightning.pytorch.strategies import ModelParallelStrategy


class ArmsModelParallelStrategy(ModelParallelStrategy):
    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        path = Path(self.broadcast(checkpoint_path))
        return _load_checkpoint(
            path=path,
            state={"state_dict": self.model},
            strict=self.lightning_module.strict_loading,
            optimizer_states_from_list=True,
            weights_only=weights_only,
        )
