"""Real data: an image folder with ``metadata.jsonl``, and WebDataset ``.tar`` shards.

Both are random-access (``dataset[i] -> (PIL RGB image, caption)``) so that data order can be a
pure function of (seed, step) rather than of a stream's position.

- Image folder, the convention of diffusers' text-to-image examples: ``metadata.jsonl`` holds
  one JSON object per line with ``file_name`` (relative to the folder) and a caption column
  (``text`` by default).
- WebDataset shards: ``.tar`` files whose members are grouped into samples by key (the member
  path up to the first dot of its last component, as WebDataset does): ``0001.jpg`` with
  ``0001.txt`` (or ``0001.json`` holding the caption column). Read with the standard library
  ``tarfile``; shards are indexed once when opened.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from divergence.errors import UserInputError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp")


class ImageFolderDataset:
    """Images listed in ``root/metadata.jsonl`` with their captions."""

    def __init__(self, root: str | Path, caption_column: str = "text"):
        self.root = Path(root)
        meta = self.root / "metadata.jsonl"
        if not meta.is_file():
            raise UserInputError(
                f"{meta}: not found; an image folder needs metadata.jsonl with one "
                f'{{"file_name": ..., "{caption_column}": ...}} object per line'
            )
        self.rows = []
        for number, line in enumerate(meta.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self.rows.append((str(row["file_name"]), str(row[caption_column])))
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise UserInputError(
                    f"{meta} line {number}: expected a JSON object with 'file_name' and "
                    f"{caption_column!r} ({err.__class__.__name__}: {err})"
                ) from None
        if not self.rows:
            raise UserInputError(f"{meta}: lists no images")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Image.Image, str]:
        name, caption = self.rows[index]
        path = self.root / name
        try:
            return _to_rgb(Image.open(path)), caption
        except (FileNotFoundError, UnidentifiedImageError) as err:
            raise UserInputError(f"{path}: cannot read image listed in metadata.jsonl ({err})") from None


class WebDatasetShards:
    """Samples of one or more ``.tar`` shards (a shard file, or a folder of them, sorted by name)."""

    def __init__(self, path: str | Path, caption_column: str = "text"):
        path = Path(path)
        shards = sorted(path.glob("*.tar")) if path.is_dir() else [path]
        if not shards or not shards[0].is_file():
            raise UserInputError(f"{path}: no .tar shards found; give a .tar file or a folder of them")
        self.shards, self.caption_column = shards, caption_column
        # One entry per sample: (shard index, image member, caption member).
        self.samples: list[tuple[int, tarfile.TarInfo, tarfile.TarInfo]] = []
        for number, shard in enumerate(shards):
            self.samples.extend((number, *pair) for pair in _index_shard(shard))
        if not self.samples:
            raise UserInputError(f"{path}: shards hold no (image, caption) samples")
        self._handles: dict[int, tarfile.TarFile] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, str]:
        number, image_member, caption_member = self.samples[index]
        tar = self._open(number)
        image = _to_rgb(Image.open(io.BytesIO(tar.extractfile(image_member).read())))
        raw = tar.extractfile(caption_member).read().decode("utf-8")
        if caption_member.name.endswith(".json"):
            raw = str(json.loads(raw).get(self.caption_column, ""))
        return image, raw.strip()

    def _open(self, number: int) -> tarfile.TarFile:
        if self._pid != os.getpid():  # a forked DataLoader worker must not share file offsets
            self._handles, self._pid = {}, os.getpid()
        if number not in self._handles:
            self._handles[number] = tarfile.open(self.shards[number])
        return self._handles[number]


def _index_shard(shard: Path) -> list[tuple[tarfile.TarInfo, tarfile.TarInfo]]:
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    try:
        with tarfile.open(shard) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                stem, dot, ext = base.partition(".")
                if dot:
                    groups.setdefault(f"{folder}/{stem}", {})[ext.lower()] = member
    except tarfile.TarError as err:
        raise UserInputError(f"{shard}: not a readable tar shard ({err})") from None
    pairs = []
    for members in groups.values():
        # "jpg", but also compound extensions such as "seg.png"; the last part decides the format.
        image = next((members[e] for e in sorted(members) if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS), None)
        caption = members.get("txt") or members.get("json")
        if image is not None and caption is not None:
            pairs.append((image, caption))
    return pairs


def _to_rgb(image: Image.Image) -> Image.Image:
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")
