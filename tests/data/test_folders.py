"""Image folder (metadata.jsonl) and WebDataset tar shards, on small data the test writes."""

import io
import json
import tarfile

import pytest
from PIL import Image

from divergence.data.batches import StepBatches
from divergence.data.folders import ImageFolderDataset, WebDatasetShards
from divergence.errors import UserInputError
from divergence.recipe.run import DataConfig


def _png(colour, size=(40, 24)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _folder(root, n=3):
    root.mkdir()
    lines = []
    for i in range(n):
        (root / f"{i}.png").write_bytes(_png((10 * i, 0, 0)))
        lines.append(json.dumps({"file_name": f"{i}.png", "text": f"picture {i}"}))
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _shard(path, items):
    with tarfile.open(path, "w") as tar:
        for name, data in items:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_image_folder_reads_images_and_captions(tmp_path):
    data = ImageFolderDataset(_folder(tmp_path / "images"))
    assert len(data) == 3
    image, caption = data[2]
    assert caption == "picture 2" and image.mode == "RGB" and image.getpixel((0, 0)) == (20, 0, 0)


def test_image_folder_errors_name_the_file(tmp_path):
    with pytest.raises(UserInputError, match="metadata.jsonl"):
        ImageFolderDataset(tmp_path)
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png"}\n')
    with pytest.raises(UserInputError, match="line 1.*'text'"):
        ImageFolderDataset(tmp_path)
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "gone.png", "text": "x"}\n')
    with pytest.raises(UserInputError, match="gone.png"):
        ImageFolderDataset(tmp_path)[0]


def test_webdataset_groups_members_by_key(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    _shard(
        shards / "000000.tar",
        [
            ("a/0001.png", _png((1, 2, 3))),
            ("a/0001.txt", b"first\n"),
            ("a/0002.png", _png((4, 5, 6))),
            ("a/0002.txt", b"second"),
        ],
    )
    _shard(
        shards / "000001.tar",
        [
            ("0003.jpg.png", _png((7, 8, 9))),
            ("0003.json", json.dumps({"text": "third"}).encode()),
            ("0004.png", _png((0, 0, 0))),
        ],
    )  # no caption: skipped
    data = WebDatasetShards(shards)
    assert len(data) == 3
    assert [data[i][1] for i in range(3)] == ["first", "second", "third"]
    assert data[2][0].getpixel((0, 0)) == (7, 8, 9)
    assert len(WebDatasetShards(shards / "000000.tar")) == 2


def test_webdataset_errors(tmp_path):
    with pytest.raises(UserInputError, match="no .tar shards"):
        WebDatasetShards(tmp_path)
    (tmp_path / "bad.tar").write_bytes(b"not a tar")
    with pytest.raises(UserInputError, match="bad.tar"):
        WebDatasetShards(tmp_path)


def test_real_images_are_resized_and_cropped_to_square(tmp_path):
    data = ImageFolderDataset(_folder(tmp_path / "images"))
    config = DataConfig(source="imagefolder", path=str(tmp_path), resolution=16, center_crop=False, random_flip=True)
    batches = StepBatches(
        data, lambda caps: __import__("torch").zeros(len(caps), 4), config, 2, (3, 16, 16), 1000, False
    )
    batch = batches.batch(0)
    assert batch.pixels.shape == (2, 3, 16, 16)
    again = StepBatches(data, lambda caps: __import__("torch").zeros(len(caps), 4), config, 2, (3, 16, 16), 1000, False)
    assert batch.pixels.equal(again.batch(0).pixels)
