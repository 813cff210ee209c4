"""The interface every checkpoint format implements: names and shapes up front, tensors lazily."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from divergence.errors import CheckpointError


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
        n = 1
        for d in self.shape:
            n *= d
        return n


class TensorSource:
    """Named tensors whose shapes and dtypes are known before any is loaded.

    Subclasses pass ``{name: TensorInfo}`` to ``__init__`` and implement ``load(name)``,
    which reads that tensor alone; a comparison holds at most two loaded tensors at once.
    """

    path = None
    metadata: dict = {}

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
        for part in parts:
            for name in part.names:
                if name in infos:
                    raise CheckpointError(f"{path}: tensor {name!r} appears in two shards ({part.path})")
                infos[name] = part.info(name)
                self._owner[name] = part
        super().__init__(infos)
        self.metadata = {}
        for part in parts:
            self.metadata.update(part.metadata)

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._owner[name].load(name)


class InMemorySource(TensorSource):
    """A state dict already in memory (a pickled checkpoint, memory-mapped where possible)."""

    def __init__(self, path, state: dict[str, torch.Tensor], prefix: str = ""):
        self.path = path
        self._state = {prefix + k: v for k, v in state.items()}
        super().__init__({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in self._state.items()})

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._state[name]
