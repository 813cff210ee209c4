"""The microbenchmark recipe: three small frozen sections, validated on construction.

``recipes/microbench.yaml`` holds the defaults below; command-line flags override single keys.
The sweep runs three studies:

- *length* (Figures 3, 4, 5): every implementation at every precision and sequence length,
  flash on the reference tile, on the reference inputs (``inputs.distribution``, ``inputs.std``);
- *tiles* (Figure 6): the flash re-implementation at the reference sequence length, for every
  tile (from an on-chip memory size, or given) and block order, on the reference inputs;
- *input scale* (Figure 7): baseline and flash (every accumulation mode) on every distribution
  of ``inputs.scales``, at the lengths of ``sweep.scale_seq_lens``, in every format but fp64
  (whose baseline is the golden value, so a ratio means nothing). Real kernels and the tile
  study stay on the reference inputs: the scale study is about the flash/baseline ratio; a
  user's kernels (``module:function``) run in it beside flash, on every distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from divergence.attention.blocks import BLOCK_ORDERS, parse_block_size, tile_from_memory
from divergence.microbench.user_kernel import is_user_impl
from divergence.microbench.scales import DEFAULT_SCALES, InputDist, parse_dist
from divergence.config.schema import apply_overrides, load_yaml, parse, require
from divergence.errors import UserInputError

PRECISIONS = ("bf16", "fp16", "fp32", "fp64")
ACCUMULATE = ("none", "fp32")
# "flash" is the re-implementation (kernel "tiled"), "flash-unbiased" it with Qiu and Yao's
# row-maximum change; the rest are registered kernel names.
IMPLS = (
    "baseline",
    "flash",
    "flash-unbiased",
    "sdpa",
    "sdpa-flash",
    "sdpa-math",
    "sdpa-efficient",
    "sdpa-cudnn",
    "flash-attn",
)
DEVICES = ("cpu", "cuda")
USER_IMPL = "module:function"

# --quick: a sweep of seconds for tests and smoke runs.
QUICK = {
    "inputs.heads": 2,
    "inputs.head_dim": 16,
    "sweep.seq_lens": [64, 128],
    "sweep.reference_seq_len": 128,
    "tiles.memory": 2048,
    "tiles.memories": [256, 1024, 2048],
    "sweep.backward_max_seq_len": 64,
}


@dataclass(frozen=True)
class InputsConfig:
    """Q, K, V: drawn once per sequence length in fp64 from a seeded generator, then rounded to
    bf16 (with magnitudes kept inside fp16's normal range), so every number format sees the
    bit-identical inputs and one fp64 golden value serves all of them."""

    batch: int = 1
    """B, the batch size."""
    heads: int = 2
    """H, attention heads."""
    head_dim: int = 64
    """D, the head dimension (``d`` of the tile rule)."""
    distribution: Literal["normal", "uniform"] = "normal"
    """The reference inputs (length and tile studies): ``normal``: N(0, std^2); ``uniform``: U(-std, std)."""
    std: float = 1.0
    """Spread of the reference distribution (the standard deviation, or the uniform half-width)."""
    scales: tuple[str, ...] = DEFAULT_SCALES
    """Distributions of the input-scale study, ``normal:STD`` (N(0, STD^2)) or ``uniform:LOW:HIGH``
    (U(LOW, HIGH)); see :mod:`divergence.microbench.scales`. Empty: no input-scale study."""
    seed: int = 0
    """Seed of the generator; the same seed gives the same Q, K, V."""
    causal: bool = False
    """Causal masking (query i sees keys j <= i)."""

    def __post_init__(self):
        for key in ("batch", "heads", "head_dim"):
            require(getattr(self, key) >= 1, f"inputs.{key}", f"must be at least 1, got {getattr(self, key)}")
        require(0 < self.std <= 100, "inputs.std", f"must be in (0, 100] so fp16 cannot overflow, got {self.std}")
        specs = [parse_dist(s, "inputs.scales").spec for s in self.scales]
        require(len(set(specs)) == len(specs), "inputs.scales", f"lists a distribution twice: {list(self.scales)}")

    def reference_dist(self) -> InputDist:
        """The inputs of the length and tile studies: N(0, std^2) or U(-std, std)."""
        if self.distribution == "normal":
            return InputDist("normal", 0.0, self.std)
        return InputDist("uniform", -self.std, self.std)

    def scale_dists(self) -> list[InputDist]:
        """The distributions of the input-scale study, in recipe order."""
        return [parse_dist(s) for s in self.scales]


@dataclass(frozen=True)
class TilesConfig:
    """Tiles of the flash re-implementation: Bc = ceil(M / 4d), Br = min(Bc, d) from on-chip
    memory M (elements), unless explicit block sizes are given."""

    memory: int = 65536
    """M of the reference tile, used in the length study (64x256 at d = 64)."""
    memories: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536, 131072)
    """M values of the tile study (Figure 6, block area)."""
    block_sizes: tuple[Union[int, str], ...] = ()
    """Explicit tiles, ``N`` (Br = Bc = N) or ``BRxBC``; when given they replace the memory-derived
    tiles everywhere and the first is the reference tile."""
    orders: tuple[str, ...] = BLOCK_ORDERS
    """Block orders of the tile study: default, swapped (Br and Bc exchanged), square (Bc x Bc)."""

    def __post_init__(self):
        require(self.memory >= 1, "tiles.memory", f"must be at least 1, got {self.memory}")
        require(
            all(m >= 1 for m in self.memories), "tiles.memories", f"must all be at least 1, got {list(self.memories)}"
        )
        for size in self.block_sizes:
            parse_block_size(size)  # raises naming the bad size
        _some_of("tiles.orders", self.orders, BLOCK_ORDERS)

    def reference_tile(self, head_dim: int) -> tuple[int, int]:
        """(Br, Bc) of the length study."""
        if self.block_sizes:
            return parse_block_size(self.block_sizes[0])
        return tile_from_memory(self.memory, head_dim)

    def study_tiles(self, head_dim: int) -> list[tuple[int | None, tuple[int, int]]]:
        """``[(M or None, (Br, Bc)), ...]`` of the tile study, before block orders."""
        if self.block_sizes:
            return [(None, parse_block_size(s)) for s in self.block_sizes]
        return [(m, tile_from_memory(m, head_dim)) for m in self.memories]


@dataclass(frozen=True)
class SweepConfig:
    """What runs: implementations, number formats, sequence lengths, accumulation modes."""

    precisions: tuple[str, ...] = PRECISIONS
    """Number formats: bf16, fp16, fp32, fp64."""
    seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    """Sequence lengths of the length study (queries and keys alike)."""
    reference_seq_len: int = 4096
    """The length of Figures 3, 4 and 6 and the findings table; one of seq_lens."""
    scale_seq_lens: tuple[int, ...] = ()
    """Lengths of the input-scale study, each one of seq_lens; empty: every swept length up to
    reference_seq_len (the longest lengths cost minutes per distribution on a CPU)."""
    impls: tuple[str, ...] = ("baseline", "flash", "flash-unbiased", "sdpa-flash", "sdpa-math")
    """baseline, flash (the re-implementation), flash-unbiased (it with the row-maximum change of
    Qiu and Yao, 2025), real kernels (sdpa, sdpa-flash, sdpa-math, sdpa-efficient, sdpa-cudnn,
    flash-attn) and a user's kernels as ``module:function`` (:mod:`.user_kernel`); baseline always
    runs, as the reference."""
    accumulate: tuple[str, ...] = ACCUMULATE
    """Modes of the re-implementation: none (all in the input format, the paper's) and fp32
    (kernel-faithful: fp32 S, m, l, O; P rounded to the input format before P V)."""
    device: str = "cpu"
    """cpu or cuda."""
    backward_max_seq_len: int = 4096
    """Gradients dq, dk, dv are measured (signed and |error|) at lengths up to this one; 0: none
    (the fp64 golden gradients hold the whole score matrix)."""

    def __post_init__(self):
        require(
            self.backward_max_seq_len >= 0,
            "sweep.backward_max_seq_len",
            f"must be 0 or more, got {self.backward_max_seq_len}",
        )
        _some_of("sweep.precisions", self.precisions, PRECISIONS)
        _some_of("sweep.impls", self.impls, (*IMPLS, USER_IMPL))
        _some_of("sweep.accumulate", self.accumulate, ACCUMULATE)
        require(
            len(self.seq_lens) > 0 and min(self.seq_lens) >= 1,
            "sweep.seq_lens",
            f"needs positive lengths, got {list(self.seq_lens)}",
        )
        require(
            self.reference_seq_len in self.seq_lens,
            "sweep.reference_seq_len",
            f"{self.reference_seq_len} is not one of sweep.seq_lens {list(self.seq_lens)}",
        )
        require(self.device in DEVICES, "sweep.device", f"{self.device!r} is not one of {', '.join(DEVICES)}")
        extra = [n for n in self.scale_seq_lens if n not in self.seq_lens]
        require(
            not extra,
            "sweep.scale_seq_lens",
            f"{extra[0] if extra else ''} is not one of sweep.seq_lens {list(self.seq_lens)}",
        )

    def scale_lengths(self) -> list[int]:
        """The lengths of the input-scale study, shortest first."""
        chosen = self.scale_seq_lens or [n for n in self.seq_lens if n <= self.reference_seq_len]
        return sorted(set(chosen))


def _some_of(key: str, values, allowed) -> None:
    """``values`` are one or more of ``allowed`` (a user's kernel, ``module:function``, when it holds
    ``USER_IMPL``: it is checked when it is loaded); else a ``RecipeError`` naming ``key``."""
    require(len(values) > 0, key, f"needs at least one of {', '.join(allowed)}")
    bad = [v for v in values if v not in allowed and not (USER_IMPL in allowed and is_user_impl(v))]
    if bad:
        require(False, key, f"{bad[0]!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class MicrobenchRecipe:
    """The whole microbenchmark recipe (``recipes/microbench.yaml``)."""

    inputs: InputsConfig = field(default_factory=InputsConfig)
    tiles: TilesConfig = field(default_factory=TilesConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def __post_init__(self):
        br, bc = self.tiles.reference_tile(self.inputs.head_dim)
        shortest = min(self.sweep.seq_lens)
        source = (
            f"tiles.block_sizes / --block-size {self.tiles.block_sizes[0]}"
            if self.tiles.block_sizes
            else f"tiles.memory={self.tiles.memory} with head_dim {self.inputs.head_dim}"
        )
        require(
            max(br, bc) <= shortest,
            "tiles",
            f"block size {br}x{bc} (from {source}) is larger than sequence length {shortest}; "
            f"use a block size of at most {shortest} or drop that length",
        )
        if self.tiles.block_sizes:
            big = [s for s in self.tiles.block_sizes if max(parse_block_size(s)) > self.sweep.reference_seq_len]
            require(
                not big,
                "tiles.block_sizes",
                f"block size {big[0] if big else ''} is larger than the reference sequence length "
                f"{self.sweep.reference_seq_len}",
            )


def load_recipe(path: str | None, overrides: list[str] = (), quick: bool = False) -> MicrobenchRecipe:
    """Read ``path`` (None: the defaults), apply --quick, then ``dotted.key=value`` overrides."""
    data = load_yaml(path) if path else {}
    if quick:
        data = apply_overrides(data, [f"{k}={v}" for k, v in QUICK.items()])
    data = apply_overrides(data, overrides)
    return parse(MicrobenchRecipe, data)


def reference_seq_len_override(recipe_path: str | None, seq_lens: list[int] | None, quick: bool) -> list[str]:
    """When --seq-len leaves out the recipe's reference length, use the largest given one."""
    if not seq_lens:
        return []
    try:
        reference = load_recipe(recipe_path, quick=quick).sweep.reference_seq_len
    except UserInputError:
        return []  # the real load reports it
    return [] if reference in seq_lens else [f"sweep.reference_seq_len={max(seq_lens)}"]
