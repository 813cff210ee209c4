"""Tied parameters: two names for one tensor, counted once.

A language model that ties its output layer to its token embedding (GPT-2 and nanoGPT:
``lm_head.weight`` is ``transformer.wte.weight``) lists the one tensor under both names in
``state_dict()``. Compared as two tensors, it would count twice in every whole-model number
(a GPT-like model: 30,080 values for 28,032 parameters). ``untie`` keeps the first
name and lists the others as ties of it; ``divergence compare`` names them in its tensor table
and the records carry them (``tied``). Two entries are one tensor when they are views of the
same storage at the same offset with the same shape, strides and dtype: the definition of
"shares memory" that ``safetensors`` refuses to save twice
(https://huggingface.co/docs/safetensors/torch_shared_tensors); views of different parts of a
storage (a fused qkv buffer split into q, k, v) are different tensors.

>>> import torch
>>> emb = torch.nn.Embedding(10, 4)
>>> kept, tied = untie({"wte.weight": emb.weight, "lm_head.weight": emb.weight, "b": torch.zeros(2)})
>>> list(kept), tied
(['wte.weight', 'b'], {'wte.weight': ['lm_head.weight']})
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch

from divergence.checkpoints.bounds import MAX_MARKER_BYTES
from divergence.errors import CheckpointError
from divergence.formats import DCP_COMPLETE_FILE

METADATA_KEY = "divergence.tied"  # a weights file's ties, as JSON {kept: [names]} (pairfolder.arm.weights_file)


def untie(state: dict) -> tuple[dict, dict[str, list[str]]]:
    """``(state without the second and later names of a tensor, {kept name: [those names]})``."""
    kept: dict = {}
    tied: dict[str, list[str]] = {}
    first: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = _storage_key(tensor)
        if key is not None and key in first:
            tied.setdefault(first[key], []).append(name)
            continue
        if key is not None:
            first[key] = name
        kept[name] = tensor
    return kept, tied


def read_ties(metadata: dict) -> dict[str, list[str]]:
    """The ties a weights file's metadata records (``METADATA_KEY``); {} when none or unreadable."""
    try:
        tied = json.loads(metadata.get(METADATA_KEY, "{}"))
    except (ValueError, RecursionError):
        return {}
    return _checked(tied)


def folder_ties(folder) -> dict[str, list[str]]:
    """The ties an arm's DCP step folder records in its ``complete.json`` (``"tied"``, written by
    ``pairfolder.arm.weights_dcp``); {} when it has none, or no readable marker (a folder DCP wrote
    by itself, a marker that is not an arm writer's: ``read_marker``)."""
    try:
        marker = json.loads(read_marker(Path(folder) / DCP_COMPLETE_FILE))
    except (OSError, ValueError, RecursionError):
        return {}
    return _checked(marker.get("tied", {})) if isinstance(marker, dict) else {}


def read_marker(path: Path) -> bytes:
    """The bytes of a DCP step folder's ``complete.json``: a regular file of at most
    ``MAX_MARKER_BYTES``. It is opened without blocking and checked before it is read, so a FIFO,
    a device (a link to ``/dev/zero``) or a huge file is refused (``CheckpointError``), never
    waited on or read whole; OSError when it cannot be opened (not there)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MARKER_BYTES:
            raise CheckpointError(
                f"{path}: not an arm writer's completion marker (a regular file of at most "
                f"{MAX_MARKER_BYTES:,} bytes); remove it, or the folder, and write the step again"
            )
        return f.read(MAX_MARKER_BYTES + 1)


def _checked(tied) -> dict[str, list[str]]:
    ok = isinstance(tied, dict) and all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in tied.values()
    )
    return {str(k): list(v) for k, v in tied.items()} if ok else {}


def _storage_key(tensor) -> tuple | None:
    """What makes two entries one tensor; None for what holds no memory of its own to share.

    A ``DTensor`` (FSDP2, tensor parallelism) is a wrapper: its key is its local shard's, with the
    global shape and placements. A rank whose shard is empty sees no storage (None): a writer of
    every rank's shards merges the ranks' ties (``pairfolder.arm.weights_dcp``). Another wrapper
    subclass without a storage of its own is never tied."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without its distributed package
        DTensor = ()  # isinstance(x, ()) is False
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    if isinstance(tensor, DTensor):
        inner = _storage_key(tensor.to_local())
        return None if inner is None else ("dtensor", inner, tuple(tensor.shape), tuple(map(str, tensor.placements)))
    if tensor.numel() == 0:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass: no storage of its own
        return None
    if pointer == 0:
        return None
    return (str(tensor.device), pointer, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
