"""Resumable Lightning ``.ckpt`` files written atomically: a temporary file, then ``os.replace``.

Lightning writes the checkpoint at its final path; a run killed mid-write would leave a truncated
``last.ckpt`` and nothing to resume from. Here the previous file stays valid until the new one
is complete.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
