"""Tied parameters: two names for one tensor, counted once.

A language model that ties its output layer to its token embedding (GPT-2 and nanoGPT:
``lm_head.weight`` is ``transformer.wte.weight``) lists the one tensor under both names in
``state_dict()``. Compared as two tensors, it would count twice in every whole-model number
(the issue's GPT-like model: 30,080 values for 28,032 parameters). ``untie`` keeps the first
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

import torch

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


def read_ties(path, metadata: dict) -> dict[str, list[str]]:
    """The ties a weights file's metadata records (``METADATA_KEY``); {} when none or unreadable."""
    try:
        tied = json.loads(metadata.get(METADATA_KEY, "{}"))
    except ValueError:
        return {}
    ok = isinstance(tied, dict) and all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in tied.values()
    )
    return {str(k): list(v) for k, v in tied.items()} if ok else {}


def _storage_key(tensor) -> tuple | None:
    """What makes two entries one tensor; None for what holds no memory of its own to share."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    pointer = tensor.untyped_storage().data_ptr()
    if pointer == 0:
        return None
    return (str(tensor.device), pointer, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
