"""Tile sizes of the FlashAttention forward pass and the block orders the paper perturbs.

FlashAttention (Dao et al., 2022, Algorithm 1) sizes its tiles from the on-chip memory ``M``
(in elements) and the head dimension ``d`` so that one query tile, one key tile, one value tile
and the output tile fit together::

    Bc = ceil(M / 4d)            key/value rows per tile
    Br = min(ceil(M / 4d), d)    query rows per tile

Each query row's arithmetic depends only on ``Bc``: a key/value tile is one online-softmax
rescaling step, so ``L / Bc`` tiles mean ``L / Bc`` chances for rounding. ``Br`` decides which
rows share a tile (scheduling), which is why the paper sees swapped orders change the result
(``Bc`` shrinks to ``Br``) and square tiles with the same ``Bc`` not.

Block orders:

- ``default``: ``(Br, Bc)`` as given;
- ``swapped``: ``(Bc, Br)``, the two dimensions exchanged;
- ``square``: ``(Bc, Bc)``, the query tile grown to the key/value tile.

>>> tile_from_memory(65536, 64)
(64, 256)
>>> ordered_tile(64, 256, "swapped")
(256, 64)
"""

from __future__ import annotations

import math

from divergence.errors import UserInputError

BLOCK_ORDERS = ("default", "swapped", "square")


def tile_from_memory(memory: int, head_dim: int) -> tuple[int, int]:
    """``(Br, Bc)`` for on-chip memory ``memory`` (elements) and head dimension ``head_dim``."""
    if memory < 1 or head_dim < 1:
        raise UserInputError(f"on-chip memory {memory} and head dim {head_dim} must both be positive")
    bc = math.ceil(memory / (4 * head_dim))
    return min(bc, head_dim), bc


def ordered_tile(block_q: int, block_kv: int, block_order: str) -> tuple[int, int]:
    """The ``(Br, Bc)`` actually used for ``block_order`` (see the module docstring)."""
    if block_order == "default":
        return block_q, block_kv
    if block_order == "swapped":
        return block_kv, block_q
    if block_order == "square":
        return block_kv, block_kv
    raise UserInputError(f"block order {block_order!r} is not one of {', '.join(BLOCK_ORDERS)}")


def parse_block_size(text: str) -> tuple[int, int]:
    """``"N"`` -> ``(N, N)``; ``"BRxBC"`` -> ``(BR, BC)``; anything else is a UserInputError.

    >>> parse_block_size("64x256"), parse_block_size("128")
    ((64, 256), (128, 128))
    """
    parts = str(text).lower().split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2) or min(sizes, default=0) < 1:
        raise UserInputError(f"block size {text!r}: expected a positive N (Br = Bc = N) or BRxBC such as 64x256")
    return (sizes[0], sizes[0]) if len(sizes) == 1 else (sizes[0], sizes[1])


def cpu_flash_tile(seq_len_q: int, seq_len_kv: int | None = None) -> tuple[int, int]:
    """The tile PyTorch's CPU flash kernel uses (``FlashAttentionKernel.cpp``, no mask).

    Query split 256 for ``Lq >= 768``, 64 for ``Lq >= 192``, else 32; key/value split 512; each
    cut to the sequence length when that is shorter.

    >>> cpu_flash_tile(4096), cpu_flash_tile(100)
    ((256, 512), (32, 100))
    """
    seq_len_kv = seq_len_q if seq_len_kv is None else seq_len_kv
    block_q = 256 if seq_len_q >= 768 else 64 if seq_len_q >= 192 else 32
    return min(block_q, seq_len_q), min(512, seq_len_kv)
