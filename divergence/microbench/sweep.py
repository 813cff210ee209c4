"""Plan and run the sweep: one row per (implementation, configuration), scored twice.

Every row is measured against the fp64 golden value (``max_abs_err``, ...) and against the
baseline in the same number format (``max_abs_diff_vs_baseline``, ...). Rows are grouped by
input distribution and sequence length so the inputs, the golden value and each format's
baseline are computed once.

Each row also carries the signed error against the golden value (``mean_signed_err``,
``bias_z``, ...; :func:`~divergence.microbench.metrics.signed_stats`), of the forward output and,
up to ``sweep.backward_max_seq_len``, of the gradients ``dq``, ``dk``, ``dv`` for one seeded
output gradient ``dO``: autograd for baseline, the real kernels and a user's kernels (where its
output has a graph; :mod:`.user_kernel`), FlashAttention-2's backward
(:mod:`divergence.attention.tiled_backward`, from the stored rounded output) for ``flash`` and
``flash-unbiased``, fp64 autograd through the golden attention for the golden gradients.

With the gradients comes ``delta`` = rowsum(dO * O) (FlashAttention-2's D, Algorithm 2), the
one place where the stored output enters every gradient (dS = P * (dP - D)): its error is
rowsum(dO * (O - O_golden)), computed in fp64 from the implementation's rounded output, so it is
what a bias of O passes into the backward pass, whatever format the kernel itself keeps D in
(Qiu and Yao, arXiv 2510.04212, 2025, section 3.2). dS itself, (L, L) per head, is not stored:
its error reaches dQ = dS K and dK = dS^T Q, which are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from tqdm.auto import tqdm

from divergence.attention.blocks import cpu_flash_tile, ordered_tile
from divergence.attention.kernels import DTYPES, get_kernel
from divergence.attention.reference import baseline_attention, golden_attention
from divergence.attention.tiled import flash_attention_tiled, num_rescalings
from divergence.attention.tiled_backward import flash_attention_tiled_backward
from divergence.errors import UserInputError
from divergence.microbench.config import MicrobenchRecipe
from divergence.microbench.inputs import make_grad_output, make_inputs
from divergence.microbench.metrics import SIGNED_KEYS, error_stats, signed_stats
from divergence.microbench.scales import InputDist, parse_dist
from divergence.microbench.user_kernel import call_user_kernel, is_user_impl, load_user_kernel, probe, user_backward
from divergence.microbench.validation import compare_with_kernel

# The results.csv contract first (its column names are public), then the extras.
CONTRACT = (
    "impl",
    "precision",
    "accumulate",
    "seq_len",
    "head_dim",
    "block_q",
    "block_kv",
    "block_order",
    "max_abs_err",
    "mean_abs_err",
    "std_abs_err",
    "max_abs_diff_vs_baseline",
)
EXTRA = (
    "max_rel_err",
    "mean_rel_err",
    "std_rel_err",
    "mean_abs_diff_vs_baseline",
    "std_abs_diff_vs_baseline",
    "memory",
    "block_area",
    "rescalings",
    "batch",
    "heads",
    "causal",
    "distribution",
    "seed",
    "device",
    "seconds",
    "input_dist",
    "input_scale",
)
# Signed error against the golden value (metrics.signed_stats): forward, then each gradient.
_SIGNED = ("mean_signed_err", "se_signed_err", "se_units", "bias_z", "rel_bias", "majority_sign_frac")
GRADS = ("dq", "dk", "dv")
SIGNED = _SIGNED + tuple(f"{g}_{c}" for g in (*GRADS, "delta") for c in ("max_abs_err", "mean_abs_err", *_SIGNED))
COLUMNS = CONTRACT + EXTRA + SIGNED
FLASH_IMPLS = ("flash", "flash-unbiased")  # the re-implementation, without and with the row-maximum change


@dataclass(frozen=True)
class Case:
    """One run. ``block_q``/``block_kv`` are the tile actually used (after ``block_order``);
    ``input_dist`` is a distribution spec (:mod:`.scales`), empty for the reference inputs."""

    impl: str
    precision: str
    seq_len: int
    accumulate: str = "none"
    block_q: int | None = None
    block_kv: int | None = None
    block_order: str = ""
    memory: int | None = None
    input_dist: str = ""


def plan(recipe: MicrobenchRecipe) -> tuple[list[Case], list[str]]:
    """The cases of the three studies, without duplicates, and notes on tiles left out."""
    s, t, d = recipe.sweep, recipe.tiles, recipe.inputs.head_dim
    ref_tile = t.reference_tile(d)
    ref_memory = None if t.block_sizes else t.memory
    ref = recipe.inputs.reference_dist().spec
    cases, notes = [], []
    for seq_len in sorted(s.seq_lens):
        for precision in s.precisions:
            cases.append(Case("baseline", precision, seq_len, input_dist=ref))
            for impl in s.impls:
                if impl in FLASH_IMPLS:
                    cases += [
                        Case(impl, precision, seq_len, acc, *ref_tile, "default", ref_memory, ref)
                        for acc in accumulate_modes(s.accumulate, precision)
                    ]
                elif impl != "baseline":
                    tile = cpu_flash_tile(seq_len) if impl == "sdpa-flash" and s.device == "cpu" else (None, None)
                    cases.append(Case(impl, precision, seq_len, "kernel", *tile, input_dist=ref))
    if "flash" in s.impls:
        for memory, (br, bc) in t.study_tiles(d):
            if max(br, bc) > s.reference_seq_len:  # only memory-derived tiles get here
                notes.append(
                    f"tile {br}x{bc} from memory {memory} is longer than the reference sequence "
                    f"length {s.reference_seq_len}; left out of the tile study"
                )
                continue
            for order in t.orders:
                tile = ordered_tile(br, bc, order)
                if order != "default" and tile == (br, bc):
                    continue  # a square tile: swapping or squaring it is the same run
                cases += [
                    Case("flash", p, s.reference_seq_len, acc, *tile, order, memory, ref)
                    for p in s.precisions
                    for acc in accumulate_modes(s.accumulate, p)
                ]
    cases += _scale_cases(recipe, ref_tile, ref_memory)
    return list(dict.fromkeys(cases)), notes


def _scale_cases(recipe: MicrobenchRecipe, ref_tile, ref_memory) -> list[Case]:
    """The input-scale study: baseline and reference-tile flash, every mode, every format but fp64."""
    s, out = recipe.sweep, []
    formats = [p for p in s.precisions if p != "fp64"]
    for dist in recipe.inputs.scale_dists():
        for seq_len in s.scale_lengths():
            for p in formats:
                out.append(Case("baseline", p, seq_len, input_dist=dist.spec))
                out += [
                    Case(impl, p, seq_len, acc, *ref_tile, "default", ref_memory, dist.spec)
                    for impl in FLASH_IMPLS
                    if impl in s.impls
                    for acc in accumulate_modes(s.accumulate, p)
                ]
                out += [Case(i, p, seq_len, "kernel", input_dist=dist.spec) for i in s.impls if is_user_impl(i)]
    return out


def accumulate_modes(modes, precision: str) -> list[str]:
    """The modes that mean something for ``precision``: fp32 accumulation is a distinct mode
    for bf16 and fp16 inputs only (for fp32 it is the paper's mode, for fp64 a narrowing)."""
    wide = ("fp32", "fp64")
    return [m for m in modes if m == "none" or precision not in wide]


def check_kernels(recipe: MicrobenchRecipe) -> None:
    """Raise UserInputError naming the first real kernel that cannot run on the sweep's device
    in one of its formats, with the fix, or the first user kernel (``module:function``) that
    cannot be imported or breaks its contract on a small input; nothing falls back to another
    kernel."""
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


def run_sweep(recipe: MicrobenchRecipe, cases: list[Case], progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Run every case: rows with :data:`COLUMNS`, and validation rows (sdpa-flash on CPU only)."""
    rows, checks = [], []
    bar = tqdm(total=len(cases), desc="microbench", unit="run", disable=not progress)
    ref = recipe.inputs.reference_dist()
    cases = [c if c.input_dist else replace(c, input_dist=ref.spec) for c in cases]
    user = {c.impl: load_user_kernel(c.impl) for c in cases if is_user_impl(c.impl)}
    groups = dict.fromkeys((c.seq_len, c.input_dist) for c in sorted(cases, key=lambda c: c.seq_len))
    for seq_len, spec in groups:
        group = [c for c in cases if (c.seq_len, c.input_dist) == (seq_len, spec)]
        dist = ref if spec == ref.spec else parse_dist(spec)
        q, k, v = make_inputs(recipe.inputs, seq_len, recipe.sweep.device, dist)
        golden = baseline_attention(q, k, v, causal=recipe.inputs.causal)
        backward = seq_len <= recipe.sweep.backward_max_seq_len
        dout = make_grad_output(recipe.inputs, seq_len, recipe.sweep.device, dist) if backward else None
        golden_grads = _golden_grads(q, k, v, dout, recipe.inputs.causal) if backward else None
        baselines = {}
        for case in group:
            bar.set_postfix_str(f"{case.impl} {case.precision} L={seq_len}", refresh=False)
            dtype = DTYPES[case.precision]
            inputs = (q.to(dtype), k.to(dtype), v.to(dtype))
            if case.precision not in baselines:
                baselines[case.precision] = baseline_attention(*inputs, causal=recipe.inputs.causal)
            start = time.perf_counter()
            out = run_case(case, *inputs, causal=recipe.inputs.causal, user=user)
            if recipe.sweep.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            row = _row(case, recipe, dist, out, golden, baselines[case.precision], seconds)
            if backward:
                grads = run_backward(case, *inputs, out, dout.to(dtype), causal=recipe.inputs.causal, user=user)
                for name, grad, gold in zip(GRADS, grads or (), golden_grads):
                    row.update(_error_columns(grad, gold, f"{name}_"))
                row.update(_delta_columns(out, golden, dout))
            rows.append(row)
            if case.impl == "sdpa-flash" and recipe.sweep.device == "cpu":
                checks.append(
                    compare_with_kernel(
                        case.precision, out, *inputs, golden, baselines[case.precision], causal=recipe.inputs.causal
                    )
                )
            bar.update()
    bar.close()
    return rows, checks


def run_case(case: Case, q, k, v, *, causal: bool, user: dict | None = None) -> torch.Tensor:
    """The output of ``case``'s implementation on (B, H, L, D) inputs already in its format;
    ``user``: the loaded ``module:function`` kernels by spec."""
    if is_user_impl(case.impl):
        fn = (user or {}).get(case.impl) or load_user_kernel(case.impl)
        with torch.no_grad():
            return call_user_kernel(case.impl, fn, q, k, v, causal=causal)
    if case.impl == "baseline":
        return baseline_attention(q, k, v, causal=causal)
    if case.impl in FLASH_IMPLS:
        return flash_attention_tiled(q, k, v, **_flash_options(case), causal=causal)
    return get_kernel(case.impl)(q, k, v, causal=causal)


def run_backward(case: Case, q, k, v, out, dout, *, causal: bool, user: dict | None = None):
    """``(dq, dk, dv)`` of ``case``'s implementation for the output gradient ``dout`` (module
    docstring): FlashAttention-2's backward from ``out`` for the re-implementation, else autograd;
    None for a user's kernel whose output has no autograd graph."""
    if is_user_impl(case.impl):
        fn = (user or {}).get(case.impl) or load_user_kernel(case.impl)
        return user_backward(case.impl, fn, q, k, v, dout, causal=causal)
    if case.impl in FLASH_IMPLS:
        options = _flash_options(case)
        _, lse = flash_attention_tiled(q, k, v, **options, causal=causal, return_lse=True)
        return flash_attention_tiled_backward(q, k, v, out, lse, dout, causal=causal, accumulate=options["accumulate"])
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    attend = baseline_attention if case.impl == "baseline" else get_kernel(case.impl)
    return torch.autograd.grad(attend(*leaves, causal=causal), leaves, dout)


def _flash_options(case: Case) -> dict:
    accumulate = None if case.accumulate == "none" else DTYPES[case.accumulate]
    options = {"block_q": case.block_q, "block_kv": case.block_kv, "accumulate": accumulate}
    return {**options, "unbiased": case.impl == "flash-unbiased"}


def _golden_grads(q, k, v, dout, causal: bool) -> tuple[torch.Tensor, ...]:
    """fp64 autograd through the golden attention: the gradients every gradient is measured against."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    return torch.autograd.grad(golden_attention(*leaves, causal=causal), leaves, dout.double())


def _signed_columns(out, ref, prefix: str = "") -> dict:
    stats = signed_stats(out, ref, units=out.shape[0] * out.shape[1])  # (B, H) slices: independent draws
    return {f"{prefix}{col}": stats[key] for col, key in zip(_SIGNED, SIGNED_KEYS)}


def _error_columns(out, gold, prefix: str) -> dict:
    """``{prefix}max_abs_err``, ``{prefix}mean_abs_err`` and the signed columns of ``out`` against ``gold``."""
    stats = error_stats(out, gold)
    row = {f"{prefix}{s}_abs_err": stats[f"{s}_abs"] for s in ("max", "mean")}
    return {**row, **_signed_columns(out, gold, prefix)}


def _delta_columns(out, golden, dout) -> dict:
    """Error of D = rowsum(dO * O) from ``out`` against the golden D, both in fp64 (module
    docstring); (B, H, L, 1), so rows are the fallback units as for the output."""
    dout = dout.double()
    delta = (dout * out.double()).sum(dim=-1, keepdim=True)
    gold = (dout * golden.double()).sum(dim=-1, keepdim=True)
    return _error_columns(delta, gold, "delta_")


def _row(case: Case, recipe: MicrobenchRecipe, dist: InputDist, out, golden, baseline, seconds) -> dict:
    vs_gold = error_stats(out, golden)
    vs_base = error_stats(out, baseline)
    tiled = case.block_q is not None
    i = recipe.inputs
    return {
        "impl": case.impl,
        "precision": case.precision,
        "accumulate": case.accumulate,
        "seq_len": case.seq_len,
        "head_dim": i.head_dim,
        "block_q": case.block_q if tiled else "",
        "block_kv": case.block_kv if tiled else "",
        "block_order": case.block_order,
        **{f"{s}_{kind}_err": vs_gold[f"{s}_{kind}"] for s in ("max", "mean", "std") for kind in ("abs", "rel")},
        **{f"{s}_abs_diff_vs_baseline": vs_base[f"{s}_abs"] for s in ("max", "mean", "std")},
        "memory": case.memory if case.memory is not None else "",
        "block_area": case.block_q * case.block_kv if tiled else "",
        "rescalings": num_rescalings(case.seq_len, case.block_kv) if tiled else "",
        "batch": i.batch,
        "heads": i.heads,
        "causal": i.causal,
        "distribution": dist.family,
        "seed": i.seed,
        "device": recipe.sweep.device,
        "seconds": round(seconds, 4),
        "input_dist": dist.spec,
        "input_scale": dist.std,
        **_signed_columns(out, golden),
    }
