"""Pick the rows each figure and finding is about, from the sweep's list of row dicts."""

from __future__ import annotations

from divergence.microbench.config import PRECISIONS, MicrobenchRecipe

MANTISSA_BITS = {"bf16": 8, "fp16": 11, "fp32": 24, "fp64": 53}


def where(rows: list[dict], **match) -> list[dict]:
    """Rows whose fields equal every ``match`` value."""
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def one(rows: list[dict], **match) -> dict | None:
    """The first row matching, or None."""
    found = where(rows, **match)
    return found[0] if found else None


def reference_rows(rows: list[dict], recipe: MicrobenchRecipe) -> list[dict]:
    """The rows on the reference inputs: the length and tile studies (and those scale-study rows
    that coincide with them)."""
    return where(rows, input_dist=recipe.inputs.reference_dist().spec)


def precisions(recipe: MicrobenchRecipe) -> list[str]:
    """The swept formats, coarsest first."""
    return [p for p in PRECISIONS if p in recipe.sweep.precisions]


def reference_flash(rows, recipe, *, precision, seq_len, accumulate="none", impl="flash", **where) -> dict | None:
    """The flash (or ``impl``: flash-unbiased, baseline) row on the reference tile, default order;
    ``where`` narrows it further (``input_dist=...``)."""
    br, bc = recipe.tiles.reference_tile(recipe.inputs.head_dim)
    return one(
        rows,
        impl=impl,
        precision=precision,
        seq_len=seq_len,
        accumulate=accumulate,
        block_q=br,
        block_kv=bc,
        block_order="default",
        **where,
    )


def kernels(recipe: MicrobenchRecipe) -> list[str]:
    """The real kernels swept, in recipe order."""
    return [i for i in recipe.sweep.impls if i not in ("baseline", "flash", "flash-unbiased")]


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when ``b`` is 0 (the fp64 baseline is the golden value itself)."""
    return a / b if b else float("nan")
