"""Lightning's ``ModelParallelStrategy`` for arms whose weights are DTensors (tensor parallel, FSDP2,
experts over the ranks), resuming from the one-file checkpoint it writes on rank zero.

The arms step their own optimizers, whose state (AdamW's moments gathered into full tensors) goes
into the checkpoint through ``ArmsModule.on_save_checkpoint``; the only optimizer Lightning holds is
the parameterless ``StepCounter``. Lightning 2.6's loader of a full checkpoint re-keys every
optimizer's state by its first entry, which fails on an optimizer with none (``IndexError``), so a
resume crashed before its first step. This strategy reads the file through the run's checkpoint IO
(``AtomicCheckpointIO``: weights-only, its allow-list checked: a checkpoint is never unpickled),
loads the full weights into the shards as Lightning does (``_load_raw_module_state``, every rank
reading the file) and returns the checkpoint whole for the module's ``on_load_checkpoint``, which
restores each arm's optimizer.
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy


class ArmsModelParallelStrategy(ModelParallelStrategy):
    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state

        path = self.broadcast(checkpoint_path)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        _load_raw_module_state(checkpoint["state_dict"], self.model, strict=self.lightning_module.strict_loading)
        return checkpoint
