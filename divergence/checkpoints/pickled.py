"""Torch pickles (``.pt``, ``.pth``, ``.bin``) and Lightning ``.ckpt`` files, loaded safely.

Checkpoints can come from anywhere, and unpickling can run arbitrary code. Every pickle is
loaded with ``torch.load(weights_only=True)``: only tensors, plain containers and numbers
are rebuilt, plus a short allow-list of inert container types that Lightning writes into
``hyper_parameters`` (``AttributeDict``). A file that names any other global (``os.system``,
a user class) is refused whole, with the global's name, and nothing from it runs.

Zip-format files (every ``torch.save`` since 1.6) are memory-mapped, so a tensor's bytes
are read when it is compared, not when the file is opened.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch

from divergence.checkpoints.source import InMemorySource
from divergence.errors import CheckpointError

# Where the model weights sit inside common checkpoint dicts, in order of preference.
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")


def load_pickled(path: str | Path, prefix: str = "") -> InMemorySource:
    """The state dict inside a pickled checkpoint, as a tensor source."""
    path = Path(path)
    obj = _safe_load(path)
    state = find_state_dict(obj, path)
    return InMemorySource(path, state, prefix)


def _safe_load(path: Path):
    mmap = zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(_inert_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found:
            raise CheckpointError(
                f"{path}: refused to unpickle: it references {found.group(1)}, which could run code. "
                "divergence loads only tensors and plain containers; if you trust the file, "
                "re-save its state_dict with safetensors (safetensors.torch.save_file)"
            ) from None
        raise CheckpointError(f"{path}: corrupt or not a torch checkpoint ({_first_line(err)})") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{path}: corrupt or truncated torch checkpoint ({_first_line(err)})") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None


def find_state_dict(obj, path: Path) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` mapping in a loaded checkpoint (a Lightning ``.ckpt`` keeps it
    under ``state_dict``; training scripts often use ``model`` or ``model_state_dict``)."""
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, dict):
        for key in STATE_DICT_KEYS:
            if isinstance(obj.get(key), dict):
                return find_state_dict(obj[key], path)
        keys = ", ".join(map(str, list(obj)[:8]))
        raise CheckpointError(
            f"{path}: no state dict found: top-level keys are {keys or '(none)'}; expected a mapping "
            f"of tensors or one of {', '.join(STATE_DICT_KEYS)}"
        )
    raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict of tensors")


def _inert_globals() -> list:
    """Container classes that carry no code of their own and appear in real checkpoints."""
    found = []
    for module, name in (
        ("lightning.fabric.utilities.data", "AttributeDict"),
        ("lightning_fabric.utilities.data", "AttributeDict"),
        ("pytorch_lightning.utilities.parsing", "AttributeDict"),
    ):
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            continue
    return found


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0].split(". ")[0][:200] if text else type(err).__name__
