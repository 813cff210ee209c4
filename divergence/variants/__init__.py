"""Named changes to one arm of a pair; see ``registry`` for the interface, ``builtin`` for the list."""

from divergence.variants import builtin  # noqa: F401  (registers the shipped variants)
from divergence.variants import optimizations  # noqa: F401  (the atlas's: fp8, int8-mixed, compile, ...)
from divergence.variants import moe  # noqa: F401  (router-bf16, expert-grouped, expert-loop, expert-parallel)
from divergence.variants import parallel  # noqa: F401  (data-parallel, zero-1, fsdp, injected-bug)
from divergence.variants.registry import VARIANT_CATEGORIES, VARIANTS, Variant, as_base, parse_variant, register

__all__ = ["VARIANT_CATEGORIES", "VARIANTS", "Variant", "as_base", "parse_variant", "register"]
