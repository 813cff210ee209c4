"""The interface every checkpoint format implements: names and shapes up front, tensors lazily."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from divergence.checkpoints.tied import untie
from divergence.errors import CheckpointError
from divergence.metrics.grouping import BUFFER_DTYPES


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    torch_dtype: torch.dtype

    @property
    def dtype(self) -> str:
        """``float32``, ``bfloat16``, ...: the name records carry."""
        return str(self.torch_dtype).removeprefix("torch.")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def is_count(value, largest: int = 2**63 - 1) -> bool:
    """An ``int`` (not a bool) from 0 to ``largest``: by default a size torch's int64 holds."""
    return type(value) is int and 0 <= value <= largest


class TensorSource:
    """Named tensors whose shapes and dtypes are known before any is loaded.

    Subclasses pass ``{name: TensorInfo}`` to ``__init__`` and implement ``load(name)``,
    which reads that tensor alone; a comparison holds at most two loaded tensors at once.
    """

    path = None
    metadata: dict = {}
    skipped: dict = {}  # {name: type name} of entries of the file that are not tensors, left out of names
    tied: dict = {}  # name -> the other names of the same tensor, left out (divergence.checkpoints.tied)

    def __init__(self, infos: dict[str, TensorInfo]):
        self._infos = dict(infos)

    @property
    def names(self) -> list[str]:
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no tensor named {name!r}") from None

    def load(self, name: str) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class CompositeSource(TensorSource):
    """Several sources seen as one (shards of a checkpoint, components of a pipeline)."""

    def __init__(self, path, parts: list[TensorSource]):
        self.path = path
        self._owner: dict[str, TensorSource] = {}
        infos = {}
        self.metadata, self.skipped, self.tied = {}, {}, {}
        for part in parts:
            for name in part.names:
                if name in infos:
                    raise CheckpointError(f"{path}: tensor {name!r} appears in two shards ({part.path})")
                infos[name] = part.info(name)
                self._owner[name] = part
            self.metadata.update(part.metadata)
            self.skipped.update(part.skipped)
            self.tied.update(part.tied)
        super().__init__(infos)

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._owner[name].load(name)


# Floating-point by torch's account, but two 4-bit values packed in each byte with no arithmetic
# (torch converts them to nothing) and meaningful only with the scales stored beside them (MX and
# NVFP4 formats): comparing the bytes would not compare the weights.
PACKED_DTYPES = tuple(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name))


def check_comparable(path, name: str, dtype: torch.dtype) -> None:
    """Floating, complex, integer and bool tensors can be compared; quantized, packed and others cannot."""
    if dtype in PACKED_DTYPES:
        raise CheckpointError(
            f"{path}: tensor {name!r} has dtype {dtype} (two 4-bit values packed per byte, scaled by a "
            "separate tensor), which divergence cannot compare; compare the dequantized weights"
        )
    # BUFFER_DTYPES: the integer and bool dtypes
    if not (dtype.is_floating_point or dtype.is_complex or str(dtype).removeprefix("torch.") in BUFFER_DTYPES):
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}, which divergence cannot compare")


class InMemorySource(TensorSource):
    """A state dict already in memory (a pickled checkpoint, memory-mapped where possible)."""

    def __init__(self, path, state: dict[str, torch.Tensor], prefix: str = ""):
        self.path = path
        self._state = {prefix + k: v for k, v in state.items()}
        self.tied = untie(self._state)[1]  # every name kept: compare_sources counts a tie once
        for name, tensor in self._state.items():
            check_comparable(path, name, tensor.dtype)
        super().__init__({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in self._state.items()})

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._state[name]
