"""Checks on a DCP folder's chunks, each done in time about linear in the number of chunks.

- **how many**: no more than ``bounds.MAX_CHUNKS``, and no more than the ``.metadata`` has
  bytes for (``bounds.MIN_METADATA_BYTES_PER_CHUNK`` each: a pickle can list one chunk object
  a million times for 2 bytes a time), counted before any chunk is looked at;
- **exact tiling** (``check_tiling``): the chunks of a tensor cover every element once. Their
  volumes must add up to the tensor's, and then, with ``f`` the function counting how many
  chunks hold each element, ``f`` must be the indicator ``1_T`` of the whole tensor. A box's
  indicator is the signed sum of the orthants ``[p, inf)`` at its 2^d corners ``p`` (sign
  ``(-1)^(number of upper coordinates)``; inclusion-exclusion), and orthant indicators are
  linearly independent, so ``f == 1_T`` exactly when the chunks' signed corner counts, added
  up in a dict, leave only ``T``'s own corners with ``T``'s signs. That is ``N * 2^d`` dict
  updates for ``N`` chunks cut along ``d`` dimensions (dimensions no chunk cuts are left out:
  ``f`` does not depend on them), where testing every pair of chunks was ``N^2``
  (https://en.wikipedia.org/wiki/Inclusion%E2%80%93exclusion_principle; the 2-D case is the
  classic "perfect rectangle" test);
- **distinct bytes** (``check_distinct_bytes``): no two chunks point at the same bytes of a
  shard, so a tensor's chunks' byte lengths, which must add up to at least the bytes it
  declares before it is allocated (``dcp_metadata``), count bytes that are really on disk. In
  a ``torch.save`` shard each chunk is an archive of its own at its own offset, so the byte
  ranges, sorted, may only touch; in a safetensors shard (``serialization_format=SAFETENSORS``,
  where DCP records every offset as 0) each tensor has at most one chunk per file.
"""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path

from divergence.checkpoints import bounds
from divergence.errors import CheckpointError


def check_counts(path: Path, metadata_bytes: int, chunks: int, what: str = "chunks") -> None:
    """``chunks`` (or storage entries) within ``MAX_CHUNKS`` and the size of the ``.metadata`` at ``path``."""
    allowed = min(bounds.MAX_CHUNKS, metadata_bytes // bounds.MIN_METADATA_BYTES_PER_CHUNK)
    if chunks > allowed:
        why = (
            f"more than the {bounds.MAX_CHUNKS:,} of the largest checkpoints"
            if chunks > bounds.MAX_CHUNKS
            else f"more than a file of {metadata_bytes:,} bytes can describe"
        )
        raise CheckpointError(f"{path}: corrupt DCP metadata: it lists {chunks:,} {what}, {why}; refused")


def check_tiling(path: Path, fqn: str, shape: tuple, chunks: list) -> None:
    """The chunks (each with ``offsets`` and ``sizes``, inside ``shape``) cover the tensor exactly."""
    numel, volume = math.prod(shape), sum(math.prod(c.sizes) for c in chunks)
    if volume != numel:
        raise CheckpointError(
            f"{path}: corrupt DCP metadata: tensor {fqn!r} of shape {list(shape)} has chunks holding "
            f"{volume:,} of its {numel:,} elements"
        )
    boxes = [c for c in chunks if 0 not in c.sizes]
    if len(boxes) < 2:
        return  # one box inside the tensor holding all its elements is the tensor
    cut = [k for k, d in enumerate(shape) if any(c.offsets[k] != 0 or c.sizes[k] != d for c in boxes)]
    if len(cut) > bounds.MAX_SPLIT_DIMS:
        raise CheckpointError(
            f"{path}: corrupt DCP metadata: tensor {fqn!r}'s chunks cut it along {len(cut)} dimensions, "
            f"more than the {bounds.MAX_SPLIT_DIMS} any sharding does"
        )
    signs = [(-1) ** sum(upper) for upper in product((0, 1), repeat=len(cut))]
    corners: dict[tuple, int] = {}
    for box in boxes:
        ends = [(box.offsets[k], box.offsets[k] + box.sizes[k]) for k in cut]
        for sign, point in zip(signs, product(*ends)):
            corners[point] = corners.get(point, 0) + sign
    whole = dict(zip(product(*[(0, shape[k]) for k in cut]), signs))
    if {p: n for p, n in corners.items() if n} != whole:
        # the volumes agree and every chunk lies inside: an element held twice is the only way
        raise CheckpointError(f"{path}: corrupt DCP metadata: two chunks of tensor {fqn!r} overlap")


def check_distinct_bytes(path: Path, placed: list[tuple[str, str, int, int]], safetensors: set[str]) -> None:
    """``placed``: ``(file, fqn, byte offset, byte length)`` of every chunk; ``safetensors``: the
    files that are safetensors shards. No two chunks may share bytes (see the module docstring)."""
    seen: set[tuple[str, str]] = set()
    ranges = []
    for file, fqn, start, length in placed:
        if file in safetensors:
            if (file, fqn) in seen:
                raise CheckpointError(
                    f"{path}: corrupt DCP metadata: two chunks of tensor {fqn!r} point at the same bytes of "
                    f"{file} (a safetensors shard holds one chunk of a tensor)"
                )
            seen.add((file, fqn))
        elif length:
            ranges.append((file, start, start + length, fqn))
    ranges.sort()
    for (file, _, end, fqn), (next_file, start, _, other) in zip(ranges, ranges[1:]):
        if file == next_file and start < end:
            whose = f"two chunks of tensor {fqn!r}" if fqn == other else f"chunks of tensors {fqn!r} and {other!r}"
            raise CheckpointError(
                f"{path}: corrupt DCP metadata: {whose} point at the same bytes of {file} (from byte {start:,}); "
                "each chunk is an archive of its own"
            )
