"""Checks before any work: every requested kernel runs here, in every requested format."""

from __future__ import annotations

from divergence.attention.kernels import DTYPES, get_kernel
from divergence.errors import UserInputError
from divergence.microbench.config import MicrobenchRecipe, load_recipe


def check_kernels(recipe: MicrobenchRecipe) -> None:
    """Raise UserInputError naming the first real kernel that cannot run on the sweep's device
    in one of its formats, with the fix, or the first user kernel (``module:function``) that
    cannot be imported or breaks its contract on a small input; nothing falls back to another
    kernel."""
    from divergence.microbench.user_kernel import is_user_impl, probe

    for impl in recipe.sweep.impls:
        if impl in ("baseline", "flash", "flash-unbiased"):
            continue
        if is_user_impl(impl):  # import it and run it small in every format: the contract's errors now
            for precision in recipe.sweep.precisions:
                probe(impl, recipe.sweep.device, DTYPES[precision], recipe.inputs.head_dim, recipe.inputs.causal)
            continue
        kernel = get_kernel(impl)
        for precision in recipe.sweep.precisions:
            reason = kernel.unavailable_reason(recipe.sweep.device, DTYPES[precision], recipe.inputs.head_dim)
            if reason:
                raise UserInputError(
                    f"--impl {impl} is unavailable on {recipe.sweep.device} in {precision}: {reason} "
                    f"(drop it from --impl, or that format from --precision)"
                )


def reference_seq_len_override(recipe_path: str | None, seq_lens: list[int] | None, quick: bool) -> list[str]:
    """When --seq-len leaves out the recipe's reference length, use the largest given one."""
    if not seq_lens:
        return []
    try:
        reference = load_recipe(recipe_path, quick=quick).sweep.reference_seq_len
    except UserInputError:
        return []  # the real load reports it
    return [] if reference in seq_lens else [f"sweep.reference_seq_len={max(seq_lens)}"]
