"""Training data: datasets of (image, caption) and the step-indexed batches built from them.

- ``sampling``: every random draw about inputs as a pure function of (seed, step);
- ``shapes``: the embedded procedurally generated captioned-shapes dataset;
- ``folders``: an image folder with ``metadata.jsonl``, and WebDataset ``.tar`` shards;
- ``batches``: the ``StepBatch`` of one step and the stream a DataLoader serves.
"""

from __future__ import annotations

from pathlib import Path

from divergence.data.folders import ImageFolderDataset, WebDatasetShards
from divergence.data.shapes import ShapesDataset
from divergence.recipe.run import DataConfig


def build_dataset(config: DataConfig):
    """The dataset a ``DataConfig`` names: ``dataset[i] -> (PIL RGB image, caption)``."""
    if config.source == "shapes":
        return ShapesDataset(config.seed, config.num_examples, config.resolution, config.max_shapes)
    # a missing data.path: refused before any work by models.build.check_local_paths
    path = Path(config.path)
    if config.source == "imagefolder":
        return ImageFolderDataset(path, config.caption_column)
    return WebDatasetShards(path, config.caption_column)
