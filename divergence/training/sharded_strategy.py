"""Lightning's ``ModelParallelStrategy`` for arms whose weights are DTensors (tensor parallel, FSDP2,
experts over the ranks), resuming from the one-file checkpoint it writes on rank zero.

The arms step their own optimizers, whose state (AdamW's moments gathered into full tensors) goes
into the checkpoint through ``ArmsModule.on_save_checkpoint``; the only optimizer Lightning holds is
the parameterless ``StepCounter``. Lightning 2.6's loader of a full checkpoint re-keys every
optimizer's state by its first entry, which fails on an optimizer with none (``IndexError``), so a
resume crashed before its first step. This strategy reads the file through the run's checkpoint IO
(``AtomicCheckpointIO``: weights-only, its allow-list checked: a checkpoint is never unpickled),
loads the full weights into the shards with torch's ``set_model_state_dict`` (the counterpart of the
``get_model_state_dict`` that wrote them; every rank reads the file, and each DTensor takes its
shard of the full tensor, with its own mesh and placements) and returns the checkpoint whole for
the module's ``on_load_checkpoint``, which restores each arm's optimizer.
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy


class ArmsModelParallelStrategy(ModelParallelStrategy):
    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        path = self.broadcast(checkpoint_path)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        options = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        # a copy: set_model_state_dict replaces the full tensors of the dict it is given by the shards
        set_model_state_dict(self.model, dict(checkpoint["state_dict"]), options=options)
        return checkpoint
