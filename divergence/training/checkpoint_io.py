"""The resume state (``resume/last.ckpt``): written atomically and durably, loaded without running code.

Writing: Lightning writes a checkpoint at its final path, so a run killed mid-write would leave a
truncated ``last.ckpt`` and nothing to resume from. Here it is written under a temporary name,
fsynced, renamed and its folder fsynced (``divergence.atomic``): the previous file stays valid
until the new one is complete and durable.

Loading: a pair folder can be copied in from another machine (``report`` and ``study`` invite
it), and unpickling can run arbitrary code. So the state is loaded with
``torch.load(weights_only=True)``, after a check of every global its pickle names against an
allow-list of exactly what our own resume state holds: Lightning's checkpoint dict is plain
dicts, lists, numbers and strings, plus ``collections.OrderedDict`` (state dicts), tensors
(``torch._utils._rebuild_tensor_v2``) and their typed storages (``torch.FloatStorage``, ...;
one per dtype a training state may hold). Anything else (``os.system``, a user class) is refused
whole with the global named, before a byte of the pickle is executed. An empty, truncated or
foreign file is one line naming it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from lightning.pytorch.plugins.io import TorchCheckpointIO

from divergence.atomic import atomic_target
from divergence.checkpoints.pickle_scan import referenced_globals
from divergence.errors import UserInputError

STORAGES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
RESUME_GLOBALS = frozenset(
    {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", *(f"torch.{dtype}Storage" for dtype in STORAGES)}
)
_MAX_PICKLE = 256 * 1024 * 1024  # the pickle holds names and numbers only; tensors are separate members


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        with atomic_target(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
        return load_resume_state(path, map_location)  # weights_only=True whatever Lightning asks


def load_resume_state(path: str | Path, map_location=None) -> dict:
    """The checkpoint dict of ``path``, loaded only if it names no global outside ``RESUME_GLOBALS``."""
    import torch

    check_resume_file(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - whatever a damaged file raises, the user gets one line
        raise UserInputError(f"{path}: {_unusable(f'cannot be loaded ({_first_line(err)})')}") from None


def check_resume_file(path: str | Path) -> None:
    """Refuse an empty, truncated or foreign resume file, or one whose unpickling could run code.

    Reads only the archive's pickle (names and numbers), never the tensors; executes nothing.
    """
    path = Path(path)
    for name in _pickle_globals(path):
        if name not in RESUME_GLOBALS:
            raise UserInputError(
                f"{path}: refused: its pickle references {name}, which could run code; divergence's own "
                f"{_unusable('holds only tensors and plain containers, so this file is not one')}"
            )


def _pickle_globals(path: Path) -> list[str]:
    """Every global the archive's pickles name (GLOBAL, STACK_GLOBAL, INST, copyreg extensions)."""
    try:
        if path.stat().st_size == 0:
            raise UserInputError(f"{path}: {_unusable('is empty (0 bytes)')}")
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if m.filename.endswith(".pkl")]
            if not members:
                raise UserInputError(f"{path}: {_unusable('holds no pickle (not a torch checkpoint)')}")
            names = []
            for member in members:
                if member.file_size > _MAX_PICKLE:
                    raise UserInputError(f"{path}: {_unusable(f'its pickle {member.filename} is too large')}")
                names += referenced_globals(archive.read(member), strict=True)
            return names
    except UserInputError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as err:
        raise UserInputError(f"{path}: {_unusable(f'is truncated or corrupt ({_first_line(err)})')}") from None
    except OSError as err:
        raise UserInputError(f"{path}: cannot read: {err.strerror or err}") from None


def _unusable(reason: str) -> str:
    return (
        f"resume state {reason}; nothing was run. Remove it to train this folder again from its "
        "start, or train into a new --out"
    )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else type(err).__name__
