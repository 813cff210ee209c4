"""Pretrained model parts: from a local ``save_pretrained`` folder or a Hugging Face hub id.

Every part's recipe section (``model.unet``, ``model.transformer``, ``model.text_encoder``,
``model.vae``) carries ``path``, ``revision``, ``subfolder`` and ``variant``
(``divergence.recipe.model.Pretrained``), handed to the library's own ``from_pretrained``:

- ``path`` an existing local folder: read with ``local_files_only=True`` (nothing downloads);
- ``path`` a hub id (``org/name``): downloaded at ``revision``, unless ``HF_HUB_OFFLINE=1``,
  where only the local hub cache is read (``local_files_only=True``);
- anything else (a path that does not exist): one ``UserInputError`` naming the recipe key.

A missing relative path of the form ``a/b`` reads as a hub id; write ``./a/b`` for a folder.

Both arms of a pair load the same files, so they start from bitwise the same weights.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from divergence.errors import UserInputError
from divergence.recipe.model import Pretrained

# ``org/name`` as the hub spells repository ids (no leading ``.``, ``/`` or ``~``).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TRUE = {"1", "on", "yes", "true"}


def is_hub_id(path: str) -> bool:
    """A hub repository id (``org/name``) that is not an existing local path."""
    return HUB_ID.fullmatch(path) is not None and not Path(path).expanduser().exists()


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set (read now, so a test or a user can set it after import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def load_pretrained(cls, source: Pretrained, key: str, what: str, **kwargs):
    """``cls.from_pretrained`` for the recipe section ``key`` (e.g. ``model.unet``), in training
    mode like a freshly built part (``from_pretrained`` returns it in eval mode).

    ``what`` says what the folder should hold, for the error message; ``kwargs`` go to
    ``from_pretrained`` (e.g. ``torch_dtype``)."""
    path = source.path
    options = {k: v for k, v in (("subfolder", source.subfolder), ("variant", source.variant)) if v is not None}
    if is_hub_id(path):
        if source.revision is not None:
            options["revision"] = source.revision
        try:
            return cls.from_pretrained(path, local_files_only=offline(), **options, **kwargs).train()
        except (OSError, ValueError) as err:
            hint = (
                "HF_HUB_OFFLINE is set, so only the local hub cache was read; unset it to download"
                if offline()
                else "check the id, revision, subfolder and variant"
            )
            reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise UserInputError(f"{key}.path {path!r}: cannot load {what} from the hub ({reason}); {hint}") from None
    folder = local_folder(path, f"{key}.path", what, source.subfolder)
    try:
        return cls.from_pretrained(str(Path(path).expanduser()), local_files_only=True, **options, **kwargs).train()
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise UserInputError(
            f"{key}.path {path!r}: cannot load {what} from {folder} ({reason}); check {key}.variant and {key}.subfolder"
        ) from None


def local_folder(path: str, key: str, what: str, subfolder: str | None = None) -> Path:
    """``path`` (joined with ``subfolder``) as a folder holding a ``config.json``, else one error line."""
    folder = Path(path).expanduser() / (subfolder or "")
    if not (folder / "config.json").is_file():
        where = f"{path!r}" + (f" (subfolder {subfolder!r})" if subfolder else "")
        state = "no such folder" if not folder.exists() else "no config.json there"
        raise UserInputError(
            f"{key} {where}: {state}; put {what} at that path, name a hub id (org/name), or override {key}=..."
        )
    return folder
