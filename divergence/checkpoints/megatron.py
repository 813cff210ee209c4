"""Megatron-Core ``torch_dist`` checkpoints: a DCP folder whose stacked layers are split per layer.

Megatron-Core's ``dist_checkpointing`` with the ``torch_dist`` backend writes, per iteration::

    iter_0001000/
        metadata.json        {"sharded_backend": "torch_dist", ...}
        common.pt            non-sharded state (arguments, iteration): never read here
        .metadata            DCP metadata (read safely, see dcp_metadata)
        __0_0.distcp ...     the chunks

The transformer block saves the tensors of all its layers as one tensor with the layer
index prepended as dim 0 (``decoder.layers.self_attention.linear_proj.weight`` of shape
``[num_layers, out, in]``, each layer its own chunk). ``MegatronFolder`` names them per layer,
as a ``state_dict`` of the model does (``decoder.layers.3.self_attention.linear_proj.weight``
of shape ``[out, in]``), so a comparison's per-tensor rows are layers; ``load`` reads only the
chunks of that layer. Optimizer state (``optimizer.*``, including the distributed optimizer's
flattened buffers) is left out with the other optimizer state (``dcp.model_names``), and
``common.pt`` is never opened.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from divergence.checkpoints import bounds
from divergence.checkpoints.dcp import DcpFolder, is_dcp_folder
from divergence.checkpoints.files import read_regular
from divergence.checkpoints.source import TensorInfo, TensorSource
from divergence.errors import CheckpointError

METADATA_JSON = "metadata.json"
BACKEND = "torch_dist"
# ``layers.`` not followed by a layer number: a stack of all the block's layers along dim 0.
STACKED = re.compile(r"(^|\.)layers\.(?!\d+\.)")


def is_megatron_folder(path: Path) -> bool:
    """A DCP folder with Megatron-Core's ``metadata.json`` naming the ``torch_dist`` backend. A
    ``metadata.json`` there that is not a regular file, or is larger than Megatron writes
    (``bounds.MAX_MEGATRON_JSON_BYTES``), is refused unread."""
    if not (is_dcp_folder(path) and (path / METADATA_JSON).exists()):
        return False
    text = read_regular(path / METADATA_JSON, bounds.MAX_MEGATRON_JSON_BYTES, "Megatron metadata.json")
    try:
        config = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("sharded_backend") == BACKEND


class MegatronFolder(DcpFolder):
    """A ``torch_dist`` folder with each stacked tensor named and loaded layer by layer."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self._layer: dict[str, tuple[str, int]] = {}
        infos = {}
        for name, stored in self._stored.items():
            shape = stored.info.shape
            if not (STACKED.search(name) and shape):
                infos[name] = stored.info
                continue
            if len(self._layer) + shape[0] > bounds.MAX_STACKED_LAYERS:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} stacks {shape[0]:,} layers; with the others, more than the "
                    f"{bounds.MAX_STACKED_LAYERS:,} per-layer tensors a folder may name (a Megatron model has "
                    "a few thousand)"
                )
            for index in range(shape[0]):
                layer_name = STACKED.sub(rf"\g<1>layers.{index}.", name, count=1)
                if layer_name in infos:
                    raise CheckpointError(f"{self.path}: tensor {layer_name!r} appears twice (stacked and per layer)")
                self._layer[layer_name] = (name, index)
                infos[layer_name] = TensorInfo(shape[1:], stored.info.torch_dtype)
        self.metadata = {"format": "megatron"}
        TensorSource.__init__(self, infos)

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        if name not in self._layer:
            return self._rows(name, 0, None)
        stacked, index = self._layer[name]
        return self._rows(stacked, index, index + 1)[0]
